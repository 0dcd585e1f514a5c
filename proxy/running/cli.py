"""replay-proxy command line: serve | extproc | check | config check/defaults | hash-key |
audit verify | report | tail."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import hashlib
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import BinaryIO, NoReturn

from proxy.config import Config
from proxy.gate.caches import GateCaches
from proxy.gate.verdict import inspect
from proxy.running.audit_tail import iter_follow, read_last
from proxy.running.check import DocumentError, iter_documents, report_json, report_lines
from proxy.running.config_file import iter_defaults, load_config
from proxy.running.report import Entry, Unreadable, iter_entries, render_text, summarize
from proxy.running.report_html import render_html
from proxy.settings import ConfigError, listen_problem
from proxy.state.audit import GENESIS, verify


class _Parser(argparse.ArgumentParser):
    """argparse, except that a bad value is one line naming the flag, not the usage text (a
    missing or unknown argument still shows the usage, which says what is expected)."""

    def error(self, message: str) -> NoReturn:
        if not message.startswith("argument "):
            super().error(message)
        self.exit(2, f"replay-proxy: {message.removeprefix('argument ')}\n")


def package_version() -> str:
    try:
        return version("replay-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="replay-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="the YAML config file")
    serve.add_argument("--upstream", help="the upstream base URL (overrides the config)")
    serve.add_argument("--host", type=host, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=port, help="listen port (default 8787; 0 = any free port)")
    serve.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        help=f"operational log level (stderr): {', '.join(_LEVELS)}",
    )
    serve.add_argument(
        "--workers", type=workers, default=1, help="processes sharing the port (SO_REUSEPORT)"
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)

    extproc = commands.add_parser("extproc", help="run the gate as Envoy's External Processor")
    extproc.add_argument("--config", help="the YAML config file (the same as serve's)")
    extproc.add_argument(
        "--listen", type=listen_address, help="HOST:PORT or unix:PATH (overrides extproc.listen)"
    )
    extproc.add_argument(
        "--log-level", type=log_level, default="INFO", help=f"log level: {', '.join(_LEVELS)}"
    )

    check = commands.add_parser("check", help="gate logged request bodies offline")
    check.add_argument("file", help="a request body, an array of items, or JSON Lines; - = stdin")
    check.add_argument("--config", help="a proxy config: pinned schemas and gate settings")
    check.add_argument("--json", action="store_true", help="one JSON verdict per document")

    config_commands = commands.add_parser("config", help="the config file").add_subparsers(
        dest="config_command", required=True
    )
    config_check = config_commands.add_parser("check", help="validate a config file, not serving")
    config_check.add_argument("file", metavar="FILE", help="the YAML config file")
    config_commands.add_parser("defaults", help="print every key with its default and meaning")

    commands.add_parser("hash-key", help="print the sha256 of a key read on stdin, for `clients:`")

    audit = commands.add_parser("audit", help="the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify_files = audit_commands.add_parser("verify", help="check the hash chain of audit files")
    verify_files.add_argument("files", nargs="+", metavar="FILE", help="oldest first; - = stdin")
    verify_files.add_argument(
        "--prev",
        type=chain_hash,
        default=GENESIS,
        help="the hash the first record continues from (default: 64 zeros, a fresh chain)",
    )

    report = audit_commands.add_parser("report", help="sum up audit files: reasons, tools, time")
    report.add_argument("files", nargs="+", metavar="FILE", help="any order, rotated ones too")
    report.add_argument("--html", metavar="OUT", help="write one self-contained HTML page instead")

    tail = audit_commands.add_parser("tail", help="print audit records as readable lines")
    tail.add_argument("file", metavar="FILE")
    tail.add_argument("-n", "--lines", type=int, default=10, help="the last N records first")
    tail.add_argument("-f", "--follow", action="store_true", help="then print records as they come")

    args = parser.parse_args(argv)
    if args.command == "config":
        return run_config_check(args.file) if args.config_command == "check" else run_defaults()
    if args.command == "hash-key":
        return run_hash_key()
    if args.command == "audit" and args.audit_command == "tail":
        return run_audit_tail(args.file, args.lines, follow=args.follow)
    if args.command == "audit" and args.audit_command == "report":
        return run_audit_report(args.files, html=args.html)
    if args.command == "audit":
        return run_audit_verify(args.files, args.prev)
    if args.command == "extproc":
        return run_extproc(args)
    try:
        config = serve_config(args) if args.command == "serve" else check_config(args)
    except ConfigError as exc:
        print(f"replay-proxy: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    if args.command == "serve":
        return run_serve(config, args)
    return run_check(args.file, config, as_json=args.json)


def check_config(args: argparse.Namespace) -> Config:
    return load_config(args.config) if args.config else Config()


def serve_config(args: argparse.Namespace) -> Config:
    """The config file, the flags over it, and the upstream key from the environment."""
    config = load_config(args.config) if args.config else Config()
    config = config.with_overrides(upstream=args.upstream, host=args.host, port=args.port)
    return config.with_secrets(os.environ)


def run_serve(config: Config, args: argparse.Namespace) -> int:
    # Imported here so that `check` never loads the HTTP stack.
    from proxy.running.serving import serve
    from proxy.running.workers import free_port, supervise

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    if args.workers > 1:
        port = config.listen.port or free_port(config.listen.host)
        worker_args = ["--host", config.listen.host, "--port", str(port), "--reuse-port"]
        worker_args += ["--log-level", args.log_level]
        if args.config:
            worker_args += ["--config", args.config]
        if args.upstream:
            worker_args += ["--upstream", args.upstream]
        return supervise(worker_args, args.workers)
    try:
        asyncio.run(serve(config, reuse_port=args.reuse_port, reload=lambda: serve_config(args)))
    except ConfigError as exc:
        print(f"replay-proxy: {blame_flags(str(exc), args)}", file=sys.stderr)  # noqa: T201
        return 2
    except OSError as exc:  # one no key accounts for
        logging.getLogger("replay_proxy").error("cannot serve: %s", exc)
        return 1
    return 0


def run_extproc(args: argparse.Namespace) -> int:
    try:
        # Imported here so that no other command loads gRPC and the Envoy protos.
        from proxy.running.extproc import serve_extproc
    except ImportError as exc:
        missing = (exc.name or "grpc").split(".")[0]
        print(  # noqa: T201
            f"replay-proxy: extproc needs grpcio and xds-protos (no module {missing}): "
            "pip install 'replay-proxy[envoy]'",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    try:
        config = check_config(args)
        asyncio.run(serve_extproc(config, args.listen or config.extproc.listen))
    except ConfigError as exc:
        said = str(exc)
        if args.listen is not None:
            said = said.replace("extproc.listen: ", "--listen: ", 1)
        print(f"replay-proxy: {said}", file=sys.stderr)  # noqa: T201
        return 2
    return 0


# The flags that stand for a config key: a start-up failure of a key set by its flag names it.
_FLAGS = {"listen.host": ("host", "--host"), "listen.port": ("port", "--port")}


def blame_flags(message: str, args: argparse.Namespace) -> str:
    key, _, rest = message.partition(": ")
    attribute, flag = _FLAGS.get(key, (None, None))
    if attribute is not None and getattr(args, attribute) is not None:
        return f"{flag}: {rest}"
    return message


def run_config_check(path: str) -> int:
    try:
        load_config(path)
    except ConfigError as exc:
        print(f"replay-proxy: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    sys.stdout.write(f"{path}: ok\n")
    return 0


def run_defaults() -> int:
    sys.stdout.write("".join(line + "\n" for line in iter_defaults()))
    return 0


def run_check(path: str, config: Config, *, as_json: bool) -> int:
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as exc:
        print(f"replay-proxy: {name}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
        return 2
    out: list[str] = []
    dirty = False
    caches = GateCaches.for_policy(config.gate)
    try:
        for document in iter_documents(name, data):
            verdict = inspect(document.body, config.gate, caches=caches)
            dirty = dirty or bool(verdict.findings)
            if as_json:
                out.append(report_json(verdict))
            else:
                out.extend(report_lines(name, document, verdict))
    except DocumentError as exc:
        print(f"replay-proxy: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    sys.stdout.write("".join(line + "\n" for line in out))
    return 1 if dirty else 0


def run_hash_key() -> int:
    if sys.stdin.isatty():
        # Typed at a terminal: not echoed, so the key stays out of the scrollback.
        key = getpass.getpass("key: ").encode("utf-8", "surrogateescape")
    else:
        key = sys.stdin.buffer.read()
        key = key[:-2] if key.endswith(b"\r\n") else key.removesuffix(b"\n")
    if not key:
        print("replay-proxy: hash-key: the key is empty", file=sys.stderr)  # noqa: T201
        return 2
    if key != key.strip():
        # HTTP trims header values and the proxy trims a Bearer token: such a key never matches.
        print(  # noqa: T201
            "replay-proxy: hash-key: the key starts or ends with whitespace, "
            "which no request can carry",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(hashlib.sha256(key).hexdigest() + "\n")
    return 0


_LEVELS = ("debug", "info", "warning", "error", "critical")
# A host name as RFC 1123 spells one: dot-separated labels of letters, digits and inner hyphens.
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def port(value: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port (0 to 65535; 0 = any free one)")
    return number


def listen_address(value: str) -> str:
    """An argparse type: HOST:PORT or unix:PATH, for `extproc --listen`."""
    problem = listen_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def host(value: str) -> str:
    """An argparse type: an IP address or a host name to listen on."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if len(value) > 253 or not _HOST_NAME.fullmatch(value):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not an IP address or a host name (an IPv6 address goes without "
                "brackets: ::1)"
            ) from None
    return value


def log_level(value: str) -> str:
    """An argparse type: a logging level's name, in any case."""
    if value.lower() not in _LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a log level ({', '.join(_LEVELS)})")
    return value.upper()


def workers(value: str) -> int:
    """An argparse type: how many worker processes, at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of processes (1 or more)")
    return number


def chain_hash(value: str) -> str:
    """An argparse type: a sha256 hex digest, as `prev` carries it."""
    digest = value.lower()
    if len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a sha256 hex digest")
    return digest


def run_audit_verify(paths: Sequence[str], start: str) -> int:
    start_name = "a fresh chain's start (64 zeros)" if start == GENESIS else "the --prev hash"
    for path in paths:
        name = "<stdin>" if path == "-" else path
        try:
            with _open_binary(path) as f:
                chain = verify(f, start, start_name=start_name)
        except OSError as exc:
            print(f"replay-proxy: {name}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
            return 2
        if chain.broken is not None:
            sys.stdout.write(f"{name}: line {chain.broken.line}: {chain.broken.reason}\n")
            return 1
        sys.stdout.write(f"{name}: ok, {chain.records} records, last hash {chain.last}\n")
        # The next file must continue from this one.
        start, start_name = chain.last, f"the last hash of {name}"
    return 0


def run_audit_report(paths: Sequence[str], *, html: str | None = None) -> int:
    """Exit 0 when every line was a record, 1 when some were not (named, the rest counted),
    2 when a file cannot be read."""
    names = ["<stdin>" if path == "-" else path for path in paths]
    entries: list[Entry | Unreadable] = []
    for path, name in zip(paths, names, strict=True):
        try:
            with _open_binary(path) as f:
                entries.extend(iter_entries(name, f))
        except OSError as exc:
            print(f"replay-proxy: {name}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
            return 2
    summary = summarize(names, entries)
    if html is None:
        sys.stdout.write(render_text(summary))
    else:
        try:
            with open(html, "w", encoding="utf-8") as page:
                page.write(render_html(summary))
        except OSError as exc:
            print(f"replay-proxy: {html}: cannot write: {exc.strerror}", file=sys.stderr)  # noqa: T201
            return 2
    if summary.unreadable:
        print(  # noqa: T201
            f"replay-proxy: {len(summary.unreadable)} unreadable line(s), named in the report",
            file=sys.stderr,
        )
    return 1 if summary.unreadable else 0


def run_audit_tail(path: str, count: int, *, follow: bool) -> int:
    """Exit 0 (also when interrupted while following), 2 when the file cannot be read."""
    if count < 0:
        print("replay-proxy: audit tail: -n must be 0 or more", file=sys.stderr)  # noqa: T201
        return 2
    try:
        with open(path, "rb") as f:
            lines, total = read_last(path, f, count)
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
            if follow:
                for line in iter_follow(path, f, line=total):
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
    except OSError as exc:
        print(f"replay-proxy: {path}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


@contextmanager
def _open_binary(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as f:
        yield f


if __name__ == "__main__":
    sys.exit(main())
