# Test hosts as network namespaces, and Open MPI's own launcher across them.
# Sourced (POSIX sh), beside lib.sh or alone (contrib/mlx4x-hosts); needs
# root, ip(8), unshare(1) and, for hosts_netem on a kernel without the
# netem qdisc, iptables(8) and python3.
#
#   hosts_up N            N hosts (2..4): network namespaces $HOST_NS_1 ..,
#                         each with lo and an eth0 (address $HOST_IP_K/24,
#                         MTU $HOSTS_MTU) whose veth peer pK is a port of the
#                         bridge br0 in a switch namespace $HOSTS_SW. Names
#                         and subnet are this process's (mlx4x-$$-h1 ..,
#                         10.A.B.0/24 from $$), so concurrent runs never meet.
#                         Nothing is created in the root namespace but the
#                         /run/netns entries. hosts_down runs at exit (also
#                         on HUP, INT, TERM); set your own EXIT trap before
#                         hosts_up: it is kept and run after hosts_down.
#   hosts_down            kills what runs in those namespaces, deletes them
#                         (their veths and bridge go with them) and Open
#                         MPI's session directories of the hosts; idempotent.
#   hosts_exec K CMD...   runs CMD on host K (its network namespace, and a
#                         UTS namespace whose host name is $HOST_NS_K).
#   hosts_mpirun ARGS...  Open MPI's mpirun on host 1 with $HOSTS_MPIRUN_OPTS
#                         (below) and ARGS: place ranks with --host
#                         "$(hosts_list SLOTS)"; without a host option, all
#                         hosts, one slot each. Bounded by timeout(1) when
#                         HOSTS_TIMEOUT (seconds) is set.
#   hosts_list [SLOTS]    "IP1:SLOTS,IP2:SLOTS,.." for --host (no SLOTS: IPs).
#   hosts_netem K SPEC    netem SPEC ("loss 1%", "delay 1ms reorder 25% 50%",
#   hosts_netem K clear   "duplicate 5%", ...) on host K's link, both
#                         directions: what K sends and what it receives
#                         (netem on eth0 alone shapes only what K sends).
#   hosts_link K down|up  cuts host K's cable: the switch port pK goes down,
#                         K's eth0 loses carrier, addresses and routes stay.
#   hosts_bytes K         bytes through host K's switch port so far (rx+tx).
#   hosts_tcpstat NAME    a TCP counter (Tcp: or TcpExt: of /proc/net/snmp,
#                         netstat: RetransSegs, TCPOFOQueue, ...) summed
#                         over the hosts: what their TCP saw of the faults.
#   hosts_netem_hits K    packets the emulated faults acted on in host K
#                         (dropped, copied, queued); "tc" with the qdisc.
#
# Exported after hosts_up: HOSTS_N, HOST_NS_K and HOST_IP_K (K = 1..N),
# HOSTS_SW, HOSTS_SUBNET, MLX4X_HOSTS (IP1,IP2,..), MLX4X_HOSTS_MAP (the
# file "IP NAMESPACE HOSTNAME" per host that contrib/mlx4x-netns-rsh, the
# rsh agent, reads), HOSTS_WHERE (a prefix command: the rank prints
# "placed: rank R netns NS host NAME addr IP" on stderr, then runs its
# arguments) and MLX4X_MPIRUN (hosts_mpirun's options as one string).
#
# Faults: hosts_netem uses tc's netem qdisc (on eth0 in K and on pK in the
# switch) where the kernel has it. Without it (CONFIG_NET_SCH_NETEM unset,
# as on the project's VMs) it emulates netem in the switch, on the frames
# bridged from and to port pK (br_netfilter hands them to iptables while
# a fault is set, and only then; the physdev match names the port): "loss P%" and "duplicate P%" as iptables
# rules (statistic match; DROP, and TEE through the switch's own address
# .254), and "delay T [J] [reorder P% [C%]]" by queueing both directions
# to contrib/mlx4x-netns-delay (NFQUEUE queue K). In the switch, not in
# K: frames a packet socket sends or receives (UCX_MLX4X_PACKET_SOCKET)
# pass neither of K's own POSTROUTING and PREROUTING, and would escape.
# Correlations other than reorder's, and other netem keywords, are
# refused (status 2); status 3: no way to shape here (say why).
# The user-space delay runs at real-time priority (at a normal one, behind
# polling ranks on every core, it let packets go up to seconds late); its
# log, $HOSTS_DIR/delay-K.log, says at the end how late the latest left.
# HOSTS_NETEM_IMPL=tc|emulate forces one way.
#
# Settings, read by hosts_up: HOSTS_MTU (1500); HOSTS_RTO_MIN (5ms: the
# hosts' TCP minimum retransmission time-out, a route attribute, so that
# TCP over a lossy link recovers in milliseconds as on a tuned cluster: the
# 4 KiB ping-pong at 5% loss took 13-17 s, with the kernel's 200 ms 78 s;
# empty: the kernel's); HOSTS_UCX_NET_DEVICES (eth0); HOSTS_MPIRUN_OPTS
# (hosts_mpirun's options, below, unless set). IPv6 is off in the hosts:
# Open MPI's out-of-band channel and UCX see one IPv4 address per host.

: "${top_srcdir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${HOSTS_MTU:=1500}"
: "${HOSTS_RTO_MIN=5ms}"
: "${HOSTS_NETEM_IMPL:=auto}"
: "${HOSTS_UCX_NET_DEVICES:=eth0}"
HOSTS_AGENT="$top_srcdir/contrib/mlx4x-netns-rsh"
HOSTS_DELAY="$top_srcdir/contrib/mlx4x-netns-delay"
HOSTS_PREFIX="mlx4x-$$"
HOSTS_N=0

# hosts_mpirun's options, and why:
#  --bind-to none: every "host" has the same cores; Open MPI binds each
#    node's first rank to core 0, so two hosts' ranks would share one core
#    (a 2-rank ping-pong took 4 ms per message instead of 12 us).
#  plm_rsh_agent: the agent enters the target's namespaces instead of ssh;
#    plm_rsh_no_tree_spawn: mpirun starts every daemon itself.
#  oob_tcp_if_include, btl_tcp_if_include, UCX_NET_DEVICES=eth0: each
#    host's lo is 127.0.0.1 too, and reaches only that host
#    (HOSTS_UCX_NET_DEVICES: UCX's devices, eth0 unless set; a transport
#    with devices of its own, such as mlx4x, adds them there).
#  oob_tcp_keepalive_*: mpirun and the daemons notice a host that is gone
#    (link cut) in about 2 + 5 x 1 s. With the defaults (300 s idle, then
#    9 x 20 s) nothing had noticed 60 s after a cut, and mpirun, told to
#    stop then, stayed in its abort for over 10 minutes.
#  pml ucx with pml_ucx_tls/devices any: Open MPI 4.1's pml ucx otherwise
#    declines every transport but verbs/mlx5 (tcp, mlx4x).
hosts_mpirun_opts() {
    echo "--allow-run-as-root --oversubscribe --bind-to none" \
        "--mca plm_rsh_agent $HOSTS_AGENT --mca plm_rsh_no_tree_spawn 1" \
        "--mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0" \
        "--mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1" \
        "--mca oob_tcp_keepalive_probes 5" \
        "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any" \
        "-x UCX_NET_DEVICES=$HOSTS_UCX_NET_DEVICES"
}

_hosts_err() { echo "hosts: $*" >&2; }

# _hosts_trap: hosts_down at exit, before the EXIT trap already set.
_hosts_trap() {
    # Once per script: a second hosts_up would take this trap for the
    # script's own and run itself for ever at exit.
    [ -n "${_hosts_trapped:-}" ] && return 0
    _hosts_trapped=1
    _hosts_prev_exit=
    _hosts_t=$(mktemp) || return 1
    trap > "$_hosts_t"                  # not in $(...): dash resets traps there
    # shellcheck disable=SC2317  # called by the eval below
    _hosts_grab() { case $3 in EXIT|0) _hosts_prev_exit=$2 ;; esac; }
    eval "$(sed 's/^trap -- /_hosts_grab -- /' "$_hosts_t")"
    rm -f "$_hosts_t"
    trap 'hosts_down; eval "$_hosts_prev_exit"' EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

hosts_up() {
    _h_n=${1:-}
    case $_h_n in 2|3|4) ;; *) _hosts_err "hosts_up N: N is 2, 3 or 4"; return 2 ;; esac
    if [ "$HOSTS_N" -gt 0 ]; then _hosts_err "hosts are up already"; return 2; fi
    if [ "$(id -u)" -ne 0 ]; then _hosts_err "network namespaces need root"; return 3; fi
    for _h_c in ip unshare hostname; do
        command -v $_h_c >/dev/null 2>&1 || { _hosts_err "$_h_c not found"; return 3; }
    done
    _hosts_trap || return 1
    HOSTS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mlx4x-hosts-$$.XXXXXX") || return 1
    export HOSTS_DIR
    # 10.A.B.0/24: A in 64..191, B in 0..255, from this process's id.
    HOSTS_NET="10.$((64 + ($$ >> 8) % 128)).$(($$ % 256))"
    HOSTS_SUBNET="$HOSTS_NET.0/24"
    HOSTS_SW="$HOSTS_PREFIX-sw"
    MLX4X_HOSTS_MAP="$HOSTS_DIR/map"
    : > "$MLX4X_HOSTS_MAP"
    export HOSTS_SW HOSTS_SUBNET MLX4X_HOSTS_MAP
    echo "$HOSTS_SW" > "$HOSTS_DIR/namespaces"
    if ! ip netns add "$HOSTS_SW"; then
        hosts_down
        _hosts_err "cannot create network namespaces here (ip netns add failed)"
        return 3
    fi
    ip -n "$HOSTS_SW" link set lo up &&
        ip -n "$HOSTS_SW" link add name br0 type bridge &&
        ip -n "$HOSTS_SW" link set br0 up || { hosts_down; return 1; }
    _hosts_noipv6 "$HOSTS_SW"
    _hosts_bridge_nf 0
    MLX4X_HOSTS=
    _h_k=1
    while [ $_h_k -le "$_h_n" ]; do
        _h_ns="$HOSTS_PREFIX-h$_h_k"
        _h_ip="$HOSTS_NET.$_h_k"
        echo "$_h_ns" >> "$HOSTS_DIR/namespaces"
        ip netns add "$_h_ns" || { hosts_down; return 1; }
        HOSTS_N=$_h_k
        { ip -n "$_h_ns" link set lo up &&
          ip -n "$HOSTS_SW" link add name "p$_h_k" mtu "$HOSTS_MTU" type veth \
              peer name eth0 netns "$_h_ns" &&
          ip -n "$HOSTS_SW" link set "p$_h_k" master br0 up &&
          ip -n "$_h_ns" link set eth0 mtu "$HOSTS_MTU" up &&
          ip -n "$_h_ns" addr add "$_h_ip/24" dev eth0; } || { hosts_down; return 1; }
        _hosts_noipv6 "$_h_ns"
        if [ -n "$HOSTS_RTO_MIN" ]; then
            ip -n "$_h_ns" route replace "$HOSTS_SUBNET" dev eth0 proto kernel scope link \
                src "$_h_ip" rto_min "$HOSTS_RTO_MIN" || { hosts_down; return 1; }
        fi
        echo "$_h_ip $_h_ns $_h_ns" >> "$MLX4X_HOSTS_MAP"
        eval "HOST_NS_$_h_k=\$_h_ns; HOST_IP_$_h_k=\$_h_ip; export HOST_NS_$_h_k HOST_IP_$_h_k"
        MLX4X_HOSTS="$MLX4X_HOSTS${MLX4X_HOSTS:+,}$_h_ip"
        _h_k=$((_h_k + 1))
    done
    # Each namespace's inode, so that a test can tell that none survives.
    for _h_ns in $(cat "$HOSTS_DIR/namespaces"); do
        stat -L -c '%i' "/run/netns/$_h_ns"
    done > "$HOSTS_DIR/inodes"
    HOSTS_WHERE="$HOSTS_DIR/where"
    cat > "$HOSTS_WHERE" <<'EOF'
#!/bin/sh
# Prints where this rank runs (stderr), then runs its arguments.
addr=$(ip -o -4 addr show dev eth0 2>/dev/null | awk '{ print $4; exit }')
echo "placed: rank ${OMPI_COMM_WORLD_RANK:-?} netns $(ip netns identify 2>/dev/null) host $(hostname) addr ${addr:-none}" >&2
exec "$@"
EOF
    chmod +x "$HOSTS_WHERE"
    : "${HOSTS_MPIRUN_OPTS:=$(hosts_mpirun_opts)}"
    MLX4X_MPIRUN=$HOSTS_MPIRUN_OPTS
    export HOSTS_N MLX4X_HOSTS HOSTS_WHERE MLX4X_MPIRUN
}

# _hosts_bridge_nf 0|1: whether the switch hands bridged frames to
# iptables (br_netfilter, per namespace; 1 is the kernel's default where the
# module is loaded). Off unless a fault is emulated: a switch forwards
# frames without a route lookup and a pass through netfilter, which cost
# every frame between the hosts about a microsecond here, whatever carried it.
_hosts_bridge_nf() {
    ip netns exec "$HOSTS_SW" sh -c "for f in /proc/sys/net/bridge/bridge-nf-call-iptables \
        /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/bridge/bridge-nf-call-arptables; do
        [ -w \$f ] && echo $1 > \$f; done; :" 2>/dev/null
    [ "$1" = 0 ] ||
        [ "$(ip netns exec "$HOSTS_SW" cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ]
}

_hosts_noipv6() {
    ip netns exec "$1" sh -c 'for f in all default eth0 lo; do
        [ -w /proc/sys/net/ipv6/conf/$f/disable_ipv6 ] &&
            echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; done; :' 2>/dev/null
}

hosts_down() {
    [ -n "${HOSTS_DIR:-}" ] && [ -d "$HOSTS_DIR" ] || return 0
    for _h_f in "$HOSTS_DIR"/delay-*.pid; do
        [ -f "$_h_f" ] && kill "$(cat "$_h_f")" 2>/dev/null
    done
    _h_nslist=$(cat "$HOSTS_DIR/namespaces" 2>/dev/null)
    # What still runs there (daemons, ranks, delayers) was started by this
    # test: TERM, then KILL what is left after 2 s.
    for _h_sig in TERM KILL; do
        _h_left=
        for _h_ns in $_h_nslist; do
            _h_pids=$(ip netns pids "$_h_ns" 2>/dev/null)
            # shellcheck disable=SC2086  # pids
            [ -n "$_h_pids" ] && { kill -$_h_sig $_h_pids 2>/dev/null; _h_left=y; }
        done
        [ -z "$_h_left" ] && break
        _h_i=0
        while [ $_h_i -lt 20 ] && [ $_h_sig = TERM ]; do
            _h_busy=
            for _h_ns in $_h_nslist; do
                [ -n "$(ip netns pids "$_h_ns" 2>/dev/null)" ] && _h_busy=y
            done
            [ -z "$_h_busy" ] && break
            sleep 0.1
            _h_i=$((_h_i + 1))
        done
    done
    for _h_ns in $_h_nslist; do
        ip netns del "$_h_ns" 2>/dev/null
        rm -rf "/dev/shm/$_h_ns.d"   # the host's /dev/shm (mlx4x-netns-rsh)
        # Open MPI's session directory on that host (named after it), left
        # when its daemon was killed.
        rm -rf "${TMPDIR:-/tmp}/ompi.$_h_ns".*
    done
    rm -rf "$HOSTS_DIR"
    _h_k=1
    while [ $_h_k -le "$HOSTS_N" ]; do
        unset "HOST_NS_$_h_k" "HOST_IP_$_h_k"
        _h_k=$((_h_k + 1))
    done
    HOSTS_N=0
    unset HOSTS_DIR MLX4X_HOSTS MLX4X_HOSTS_MAP HOSTS_WHERE
    return 0
}

# _hosts_k K: checks that host K exists.
_hosts_k() {
    case ${1:-} in
        ''|*[!0-9]*) _hosts_err "no host '${1:-}'"; return 2 ;;
    esac
    if [ "$1" -lt 1 ] || [ "$1" -gt "$HOSTS_N" ]; then
        _hosts_err "no host $1 (hosts 1..$HOSTS_N are up)"; return 2
    fi
}

hosts_exec() {
    _hosts_k "${1:-}" || return
    "$HOSTS_AGENT" --exec "$@"
}

hosts_list() {
    _l=
    _h_k=1
    while [ $_h_k -le "$HOSTS_N" ]; do
        _l="$_l${_l:+,}$HOSTS_NET.$_h_k${1:+:$1}"
        _h_k=$((_h_k + 1))
    done
    echo "$_l"
}

hosts_mpirun() {
    [ "$HOSTS_N" -gt 0 ] || { _hosts_err "no hosts (hosts_up N first)"; return 2; }
    # No host option: every host, one slot each (Open MPI spreads the ranks
    # evenly over them, oversubscribing each alike).
    _h_hosts=$(hosts_list)
    for _h_a in "$@"; do
        case $_h_a in
            -H|--host|-host|--host=*|-host=*|--hostfile|-hostfile|--machinefile|-machinefile|\
            --default-hostfile|-default-hostfile) _h_hosts='' ;;
        esac
    done
    set -- ${_h_hosts:+--host "$_h_hosts"} "$@"
    # shellcheck disable=SC2086  # the options are words
    if [ -n "${HOSTS_TIMEOUT:-}" ]; then
        _hosts_bg timeout -k 10 "$HOSTS_TIMEOUT" "$HOSTS_AGENT" --exec 1 mpirun $HOSTS_MPIRUN_OPTS "$@"
    else
        _hosts_bg "$HOSTS_AGENT" --exec 1 mpirun $HOSTS_MPIRUN_OPTS "$@"
    fi
}

# _hosts_bg CMD...: CMD in the background, waited for, so that a TERM or
# INT to this shell runs its trap (exit, hosts_down) at once rather than
# when CMD ends; CMD keeps this shell's stdin (through fd 7).
_hosts_bg() {
    exec 7<&0
    "$@" <&7 7<&- &
    _h_bg=$!
    exec 7<&-
    wait $_h_bg
}

hosts_link() {
    _hosts_k "${1:-}" || return
    case ${2:-} in
        up|down) ip -n "$HOSTS_SW" link set "p$1" "$2" ;;
        *) _hosts_err "hosts_link K down|up"; return 2 ;;
    esac
}

hosts_bytes() {
    _hosts_k "${1:-}" || return
    ip netns exec "$HOSTS_SW" cat "/sys/class/net/p$1/statistics/rx_bytes" \
        "/sys/class/net/p$1/statistics/tx_bytes" | awk '{ t += $1 } END { printf "%.0f\n", t }'
}

# _hosts_netem_impl: tc where the kernel has netem, else emulate (cached).
_hosts_netem_impl() {
    if [ "$HOSTS_NETEM_IMPL" = auto ]; then
        if ip netns exec "$HOSTS_SW" tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then
            ip netns exec "$HOSTS_SW" tc qdisc del dev lo root 2>/dev/null
            HOSTS_NETEM_IMPL=tc
        else
            HOSTS_NETEM_IMPL=emulate
        fi
    fi
}

hosts_netem() {
    _hosts_k "${1:-}" || return
    _h_k=$1
    shift
    [ $# -gt 0 ] || { _hosts_err "hosts_netem K SPEC|clear"; return 2; }
    _h_ns="$HOSTS_PREFIX-h$_h_k"
    _hosts_netem_impl
    if [ "$HOSTS_NETEM_IMPL" = tc ]; then
        if [ "$*" = clear ]; then
            ip netns exec "$_h_ns" tc qdisc del dev eth0 root 2>/dev/null
            ip netns exec "$HOSTS_SW" tc qdisc del dev "p$_h_k" root 2>/dev/null
            return 0
        fi
        # shellcheck disable=SC2068
        ip netns exec "$_h_ns" tc qdisc replace dev eth0 root netem $@ &&
            ip netns exec "$HOSTS_SW" tc qdisc replace dev "p$_h_k" root netem $@
        return
    fi
    # shellcheck disable=SC2048,SC2086  # SPEC's words
    _hosts_emulate "$_h_k" $*
}

hosts_tcpstat() {
    _h_k=1
    while [ $_h_k -le "$HOSTS_N" ]; do
        ip netns exec "$HOSTS_PREFIX-h$_h_k" cat /proc/net/snmp /proc/net/netstat
        _h_k=$((_h_k + 1))
    done | awk -v want="${1:-}" '
        # Pairs of lines: "Tcp: Name1 Name2 ..." then "Tcp: value1 value2 ...".
        $1 == "Tcp:" || $1 == "TcpExt:" {
            if (!(($1) in names)) { names[$1] = $0; next }
            split(names[$1], n); delete names[$1]
            for (i = 2; i <= NF; i++) if (n[i] == want) t += $i
        }
        END { print t + 0 }'
}

# hosts_shape K SPEC CHECK: hosts_netem K SPEC before the check named
# CHECK; where it cannot be done, the check is counted as skipped (this
# host cannot shape links: status 3) or failed, and the status is non-zero.
hosts_shape() {
    _h_err=$(hosts_netem "$1" "$2" 2>&1)
    case $? in
        0) return 0 ;;
        3) skip "$3: cannot shape host $1's link here: $_h_err" ;;
        *) fail "$3: hosts_netem $1 '$2': $_h_err" ;;
    esac
    return 1
}

hosts_netem_hits() {
    _hosts_k "${1:-}" || return
    if [ "$HOSTS_NETEM_IMPL" = tc ]; then echo tc; return 0; fi
    for _h_c in "MLX4X_${1}_IN" "MLX4X_${1}_OUT"; do
        ip netns exec "$HOSTS_SW" iptables -w -t mangle -L "$_h_c" -v -n -x 2>/dev/null
    done | awk '$1 ~ /^[0-9]+$/ { t += $1 } END { print t + 0 }'
}

# _hosts_pct P%: P/100 for iptables' statistic match.
_hosts_pct() {
    case $1 in
        *%) ;;
        *) _hosts_err "netem: '$1' is not a percentage"; return 2 ;;
    esac
    awk -v p="${1%\%}" 'BEGIN { if (p + 0 != p || p < 0 || p > 100) exit 1; printf "%.6f\n", p / 100 }' ||
        { _hosts_err "netem: bad percentage '$1'"; return 2; }
}

_hosts_emulate() {
    _h_k=$1
    shift
    command -v iptables >/dev/null 2>&1 ||
        { _hosts_err "the kernel has no netem qdisc and iptables is not installed"; return 3; }
    _hosts_ipt() { ip netns exec "$HOSTS_SW" iptables -w -t mangle "$@"; }   # in the switch
    _h_in="MLX4X_${_h_k}_IN" _h_out="MLX4X_${_h_k}_OUT"
    # Host K's chains, hooked once; "replace" empties them. Bridged frames
    # pass iptables (br_netfilter's bridge-nf-call-iptables, per namespace).
    # Two hooks, so that a frame between two shaped hosts gets both: a
    # queued packet's verdict ends its hook.
    if ! _hosts_ipt -n -L "$_h_in" >/dev/null 2>&1; then
        { _hosts_ipt -N "$_h_in" && _hosts_ipt -N "$_h_out" &&
          _hosts_ipt -A FORWARD -m physdev --physdev-in "p$_h_k" -j "$_h_out" &&
          _hosts_ipt -A POSTROUTING -m physdev --physdev-is-bridged --physdev-out "p$_h_k" -j "$_h_in"; } 2>/dev/null ||
            { _hosts_err "the switch cannot filter bridged frames (br_netfilter, iptables' physdev match missing?)"; return 3; }
    fi
    _hosts_ipt -F "$_h_in" && _hosts_ipt -F "$_h_out"
    if [ -f "$HOSTS_DIR/delay-$_h_k.pid" ]; then
        kill "$(cat "$HOSTS_DIR/delay-$_h_k.pid")" 2>/dev/null
        rm -f "$HOSTS_DIR/delay-$_h_k.pid"
    fi
    if [ "$*" = clear ]; then
        # The switch back to plain forwarding once no host's faults are left.
        ip netns exec "$HOSTS_SW" iptables -w -t mangle -S 2>/dev/null |
            grep -q '^-A MLX4X_[0-9]*_' || _hosts_bridge_nf 0
        return 0
    fi
    _hosts_bridge_nf 1 || { _hosts_err "the switch cannot hand bridged frames to iptables (br_netfilter)"; return 3; }
    _h_loss=''
    _h_dup=''
    _h_delay=
    while [ $# -gt 0 ]; do
        case $1 in
            loss)
                _h_loss=$(_hosts_pct "${2:-}") || return 2
                shift 2 ;;
            duplicate)
                _h_dup=$(_hosts_pct "${2:-}") || return 2
                shift 2 ;;
            delay)
                _h_delay="delay ${2:-}"
                shift 2
                case ${1:-} in [0-9]*) _h_delay="$_h_delay $1"; shift ;; esac
                if [ "${1:-}" = reorder ]; then
                    _h_delay="$_h_delay reorder ${2:-}"
                    shift 2
                    case ${1:-} in [0-9]*) _h_delay="$_h_delay $1"; shift ;; esac
                fi ;;
            *)
                _hosts_err "netem emulation: '$1' is not supported (loss P%, duplicate P%, delay T [J] [reorder P% [C%]])"
                return 2 ;;
        esac
        case ${1:-} in [0-9]*)
            _hosts_err "netem emulation: correlation '$1' is supported for reorder only"
            return 2 ;;
        esac
    done
    if [ -n "$_h_loss" ]; then
        for _h_c in "$_h_in" "$_h_out"; do
            _hosts_ipt -A "$_h_c" -m statistic --mode random --probability "$_h_loss" -j DROP || return 3
        done
    fi
    if [ -n "$_h_dup" ]; then
        # A copy routed by the switch to the frame's destination host (TEE
        # needs an address of the switch's own on the subnet: .254).
        ip -n "$HOSTS_SW" addr replace "$HOSTS_NET.254/24" dev br0 || return 3
        _hosts_ipt -A "$_h_in" -m statistic --mode random --probability "$_h_dup" \
            -j TEE --gateway "$HOSTS_NET.$_h_k" || return 3
        _h_j=1
        while [ $_h_j -le "$HOSTS_N" ]; do
            [ $_h_j -ne "$_h_k" ] && { _hosts_ipt -A "$_h_out" -d "$HOSTS_NET.$_h_j" -m statistic --mode random \
                --probability "$_h_dup" -j TEE --gateway "$HOSTS_NET.$_h_j" || return 3; }
            _h_j=$((_h_j + 1))
        done
    fi
    if [ -n "$_h_delay" ]; then
        command -v python3 >/dev/null 2>&1 || { _hosts_err "delay emulation needs python3"; return 3; }
        # shellcheck disable=SC2086
        ip netns exec "$HOSTS_SW" python3 "$HOSTS_DELAY" --parent $$ --queue "$_h_k" $_h_delay \
            >>"$HOSTS_DIR/delay-$_h_k.log" 2>&1 &
        echo $! > "$HOSTS_DIR/delay-$_h_k.pid"
        # Queue K is bound once it is listed (packets pass until then).
        _h_i=0
        until ip netns exec "$HOSTS_SW" awk -v q="$_h_k" '$1 == q { f = 1 } END { exit !f }' \
                /proc/net/netfilter/nfnetlink_queue 2>/dev/null; do
            _h_i=$((_h_i + 1))
            if [ $_h_i -gt 100 ] || ! kill -0 "$(cat "$HOSTS_DIR/delay-$_h_k.pid")" 2>/dev/null; then
                _hosts_err "the delay emulation did not start: $(tail -n 3 "$HOSTS_DIR/delay-$_h_k.log")"
                return 3
            fi
            sleep 0.05
        done
        for _h_c in "$_h_in" "$_h_out"; do
            _hosts_ipt -A "$_h_c" -j NFQUEUE --queue-num "$_h_k" --queue-bypass || return 3
        done
    fi
    return 0
}
