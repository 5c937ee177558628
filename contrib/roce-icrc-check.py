#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""roce-icrc-check.py CAPTURE [UDP_PORT...]: checks the ICRC of every RoCEv2
datagram in a pcap or pcapng capture of an Ethernet interface (dumpcap,
tcpdump), as IBA Annex A17.4.5.1 defines it for IPv4: CRC-32 over 64 bits
of ones, the IP header with TOS, TTL and checksum as ones, the UDP header
with its checksum as ones, the BTH with Resv8a as ones, and the rest of the
packet up to the ICRC. It uses zlib's CRC-32, not mlx4x's code, and the
headers as the kernel sent them, so it shows the wire is right on its own.

Datagrams to or from UDP port 4791 count, and to or from the ports given.
Prints "N RoCEv2 datagrams (S cut from GSO batches), M with a wrong ICRC"
and exits 1 if M > 0 or N == 0. S counts the datagrams with an IP ID
other than 0: a datagram sent alone has 0, the segments of a UDP GSO
batch count 0, 1, 2, ... (the ICRC covers the ID). A capture of a
virtual link that carries a batch uncut shows it as one IP packet larger
than the link's MTU: cut it before the capture (ethtool -K DEV
tx-udp-segmentation off)."""
import struct
import sys
import zlib


def packets(path):
    """The frames of a pcap or pcapng file of link type Ethernet."""
    data = open(path, 'rb').read()
    magic = data[:4]
    if magic in (b'\xd4\xc3\xb2\xa1', b'\x4d\x3c\xb2\xa1'):
        off = 24
        while off + 16 <= len(data):
            incl = struct.unpack_from('<I', data, off + 8)[0]
            yield data[off + 16:off + 16 + incl]
            off += 16 + incl
    elif magic == b'\x0a\x0d\x0d\x0a':
        off = 0
        while off + 12 <= len(data):
            btype, blen = struct.unpack_from('<II', data, off)
            if btype == 6:   # enhanced packet block
                caplen = struct.unpack_from('<I', data, off + 20)[0]
                yield data[off + 28:off + 28 + caplen]
            off += blen
    else:
        sys.exit('%s: not a pcap or pcapng file' % path)


def icrc_ok(ip, udp_and_payload):
    masked = bytearray(ip)
    masked[1] = 0xff                        # TOS
    masked[8] = 0xff                        # TTL
    masked[10:12] = b'\xff\xff'             # header checksum
    rest = bytearray(udp_and_payload[:-4])
    rest[6:8] = b'\xff\xff'                 # UDP checksum
    rest[8 + 4] = 0xff                      # BTH Resv8a
    crc = zlib.crc32(b'\xff' * 8 + bytes(masked) + bytes(rest))
    return struct.pack('<I', crc) == udp_and_payload[-4:]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ports = {4791} | {int(p) for p in sys.argv[2:]}
    total = bad = cut = 0
    for f in packets(sys.argv[1]):
        if len(f) < 14 + 20 + 8 + 12 + 4 or f[12:14] != b'\x08\x00':
            continue
        ip_len = (f[14] & 0x0f) * 4
        ip = f[14:14 + ip_len]
        if ip[9] != 17:
            continue
        total_len = struct.unpack_from('>H', ip, 2)[0]
        udp = f[14 + ip_len:14 + total_len]
        sport, dport = struct.unpack_from('>HH', udp, 0)
        if sport not in ports and dport not in ports:
            continue
        total += 1
        cut += struct.unpack_from('>H', ip, 4)[0] != 0
        if not icrc_ok(ip, udp):
            bad += 1
    print('%d RoCEv2 datagrams (%d cut from GSO batches), %d with a wrong ICRC'
          % (total, cut, bad))
    return 1 if bad or not total else 0


if __name__ == '__main__':
    sys.exit(main())
