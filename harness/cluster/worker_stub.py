"""The process torchrun starts for each worker of a preloaded job (harness.cluster.workers).

    python -I -S worker_stub.py COMMAND...

Standard library only, no site (~20 ms): it hands its argv, working directory, environment
and stdin/stdout/stderr to its host's worker server (CHAOS_WORKER_SERVER, an abstract unix
socket), which forks the worker from a warm interpreter; it forwards every signal it gets
to the worker and exits as the worker did. Without a server, or when the server answers
that the command cannot be preloaded, it execs COMMAND itself.
"""
import json
import os
import signal
import socket
import sys

SERVER_ENV = "CHAOS_WORKER_SERVER"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _exec(command, why=None):
    if why:
        print(f"chaos: job.start preloaded: this worker starts by exec, as {why}", file=sys.stderr, flush=True)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"chaos: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127)


def main(command):
    name = os.environ.get(SERVER_ENV)
    if not command:
        print("usage: python -I -S worker_stub.py COMMAND...", file=sys.stderr)
        return 2
    if not name:
        _exec(command)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect("\0" + name)
    except OSError as exc:
        _exec(command, f"its host's worker server is not there ({exc.strerror})")
    request = json.dumps({"argv": command, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [request], [0, 1, 2])
    answer = json.loads(conn.recv(65536) or b'{"exec": "its host\'s worker server closed"}')
    if "exec" in answer:
        conn.close()
        _exec(command, answer["exec"])
    worker = answer["pid"]

    def forward(number, frame):
        try:
            os.kill(worker, number)
        except ProcessLookupError:
            pass  # it ended: its exit is on the way

    for number in FORWARDED:
        signal.signal(number, forward)
    ended = json.loads(conn.recv(65536) or b'{"exit": 70}')  # 70: the server went first
    if "signal" in ended:  # ended by it: so does the stub, for torchrun to read (-9 for a SIGKILL)
        if ended["signal"] not in (signal.SIGKILL, signal.SIGSTOP):  # those take no handler
            signal.signal(ended["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), ended["signal"])
    return ended.get("exit", 70)


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
