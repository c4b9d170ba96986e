#!/usr/bin/env python3
"""Raw TCP goodput per NIC on the emulated cluster, in the collectives' own
pattern: every node sends on each rail to the next node's same rail (a ring
per rail) and receives from the previous one, all N x L flows at once, so
each NIC is full duplex and the host's cores carry as many flows as a ring
collective's. One process per node, run in the node's namespace:

    goodput.py --node K --nodes N --rails L [--secs 4] [--warm 1] [--port 29750]

Prints one line per rail: "goodput node K rail I rx_bytes B secs T GBps G",
the bytes received in a window of --secs after --warm seconds of the flow
(skipping the shaper's initial burst and the other flows' start). No
timestamps cross hosts: each receiver times its own window.
"""
import argparse
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def addr(rail, node):
    return f"198.18.{rail}.{node + 1}"


def receive(srv, secs, warm, out, i):
    conn, _ = srv.accept()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    n = conn.recv_into(view)  # the window starts from the first byte
    t_start = time.monotonic() + warm
    while n and time.monotonic() < t_start:
        n = conn.recv_into(view)
    got, t0 = 0, time.monotonic()
    t_end = t0 + secs
    while n and time.monotonic() < t_end:
        n = conn.recv_into(view)
        got += n
    out[i] = (got, time.monotonic() - t0)
    while n:  # drain until the sender stops
        n = conn.recv_into(view)
    conn.close()


def send(rail, node, nodes, port, total_s):
    src, dst = addr(rail, node), addr(rail, (node + 1) % nodes)
    deadline = time.monotonic() + 15
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((src, 0))
        try:
            s.connect((dst, port))
            break
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    data = memoryview(bytearray(CHUNK))
    end = time.monotonic() + total_s
    try:
        while time.monotonic() < end:
            s.sendall(data)
    except OSError:
        pass  # the receiver went first
    s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", type=int, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--rails", type=int, required=True)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=29750)
    a = ap.parse_args()
    out = [None] * a.rails
    threads = []
    for r in range(a.rails):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr(r, a.node), a.port))
        srv.listen(1)
        threads.append(threading.Thread(target=receive, args=(srv, a.secs, a.warm, out, r)))
    # Senders outlast every receiver's window, whoever started last.
    for r in range(a.rails):
        threads.append(threading.Thread(target=send, daemon=True,
                                        args=(r, a.node, a.nodes, a.port, a.warm + a.secs + 3)))
    for t in threads:
        t.start()
    for t in threads[:a.rails]:
        t.join(a.warm + a.secs + 30)
    ok = True
    for r in range(a.rails):
        if out[r] is None or out[r][1] <= 0:
            print(f"goodput node {a.node} rail {r}: no measurement", file=sys.stderr)
            ok = False
            continue
        got, t = out[r]
        print(f"goodput node {a.node} rail {r} rx_bytes {got} secs {t:.3f} GBps {got / t / 1e9:.6f}")
    sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
