// SPDX-License-Identifier: BSD-3-Clause
// What every mlx4x tool answers before it looks at the fabric, as GNU tools
// do: --help (-h) prints its usage and what it does on stdout and exits 0;
// --version (-V) prints "NAME (mlx4x) VERSION" and exits 0.
#pragma once

#include "mlx4x_config.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace mlx4x::tools {

inline void print_version(const char *name)
{
    std::printf("%s (mlx4x) %s\n", name, PACKAGE_VERSION);
}

/// A command-line error: "NAME: why" and the usage line on stderr. Returns
/// 2, the exit status of a usage error.
inline int usage_error(const char *name, const std::string &why, const char *usage)
{
    std::fprintf(stderr, "%s: %s\nusage: %s\n", name, why.c_str(), usage);
    return 2;
}

/// `usage`: the synopsis lines; `about`: what the tool does, and where its
/// manual page is.
inline void answer_help_and_version(int argc, char **argv, const char *name,
                                    const char *usage, const char *about)
{
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::printf("usage: %s\n\n%s\n", usage, about);
            std::exit(0);
        }
        if (!std::strcmp(argv[i], "--version") || !std::strcmp(argv[i], "-V")) {
            print_version(name);
            std::exit(0);
        }
    }
}

/// A whole number argument (decimal, 0x hex or 0 octal, as strtoul's base
/// 0), or nullopt for anything else.
inline std::optional<unsigned long> number(const char *arg)
{
    char *end = nullptr;
    unsigned long v = std::strtoul(arg, &end, 0);
    if (end == arg || *end) {
        return std::nullopt;
    }
    return v;
}

} // namespace mlx4x::tools
