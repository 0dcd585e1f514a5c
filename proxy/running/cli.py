"""replay-proxy command line: serve | extproc | check | config check/defaults | hash-key |
audit verify | report | tail."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import glob
import hashlib
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any, BinaryIO, NoReturn

from proxy.config import Config
from proxy.gate.policy import Policy
from proxy.running.audit_tail import iter_follow, read_last
from proxy.running.check import (
    Checker,
    CheckTally,
    iter_json,
    iter_lines,
    iter_summary,
    report_unreadable,
)
from proxy.running.config_file import iter_defaults, load_config
from proxy.running.config_review import iter_unreachable, iter_warnings
from proxy.running.documents import WRAPPERS, UnreadableDocument, iter_documents
from proxy.running.report import (
    Entry,
    UnreadableLine,
    find_records,
    iter_entries,
    read_judged,
    render_record,
    render_text,
    summarize,
)
from proxy.running.report_html import render_html
from proxy.settings import LOG_FORMATS, ConfigError, listen_problem
from proxy.state.audit import GENESIS, verify
from proxy.state.workers import WorkerSlot


class _CommandParser(argparse.ArgumentParser):
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
    parser = _CommandParser(prog="replay-proxy", description=__doc__)
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
        "--log-format",
        choices=LOG_FORMATS,
        help="the log's format: text | json (overrides log.format; default text)",
    )
    serve.add_argument(
        "--workers", type=workers, default=1, help="processes sharing the port (SO_REUSEPORT)"
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    # Given by the supervisor of `--workers N` to each worker (proxy.state.workers).
    serve.add_argument("--worker-slot", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-dir", help=argparse.SUPPRESS)

    extproc = commands.add_parser("extproc", help="run the gate as Envoy's External Processor")
    extproc.add_argument("--config", help="the YAML config file (the same as serve's)")
    extproc.add_argument(
        "--listen", type=listen_address, help="HOST:PORT or unix:PATH (overrides extproc.listen)"
    )
    extproc.add_argument(
        "--log-level", type=log_level, default="INFO", help=f"log level: {', '.join(_LEVELS)}"
    )
    extproc.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="the log's format: text | json (overrides log.format; default text)",
    )

    check = commands.add_parser(
        "check",
        help="gate logged requests, responses and audit records offline",
        description=CHECK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="files or globs; - = stdin")
    check.add_argument("--config", help="a proxy config: pinned schemas and gate actions")
    check.add_argument("--json", action="store_true", help="one JSON line per finding")
    check.add_argument(
        "--ledger",
        type=ledger_url,
        metavar="URL",
        help="the proxy's Redis ledger (redis://host:port/db): a follow-up's outputs pair with "
        "the calls it recorded",
    )
    check.add_argument(
        "--vendor",
        type=vendor_slug,
        help="the vendor of the upstream the documents went to (as upstreams: names it, e.g. "
        "openai): its kinds of item are judged as the proxy judges them on a route to it; "
        "default none (the gate's core kinds, every other unslugged kind passing)",
    )
    check.add_argument(
        "--tenant",
        default="-",
        help="whose records --ledger reads: the tenant of its audit records (a clients: name or "
        "t_...); default - (a request without a credential)",
    )

    config_commands = commands.add_parser("config", help="the config file").add_subparsers(
        dest="config_command", required=True
    )
    config_check = config_commands.add_parser("check", help="validate a config file, not serving")
    config_check.add_argument("file", metavar="FILE", help="the YAML config file")
    config_check.add_argument(
        "--connect",
        action="store_true",
        help="also connect to each upstream, ping a Redis ledger and open audit.path to append",
    )
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
    report.add_argument(
        "--config", metavar="FILE", help="a proxy config: its tenants: names the fingerprints"
    )
    report.add_argument(
        "--metrics",
        metavar="FILE",
        help="a saved scrape of /-/metrics: the requests judged, and the rejection rate",
    )
    report.add_argument(
        "--request-id", metavar="ID", help="print the record(s) of this request id instead"
    )

    tail = audit_commands.add_parser("tail", help="print audit records as readable lines")
    tail.add_argument("file", metavar="FILE")
    tail.add_argument("-n", "--lines", type=int, default=10, help="the last N records first")
    tail.add_argument("-f", "--follow", action="store_true", help="then print records as they come")

    args = parser.parse_args(argv)
    if args.command == "config":
        if args.config_command == "check":
            return run_config_check(args.file, connect=args.connect)
        return run_defaults()
    if args.command == "hash-key":
        return run_hash_key()
    if args.command == "audit" and args.audit_command == "tail":
        return run_audit_tail(args.file, args.lines, follow=args.follow)
    if args.command == "audit" and args.audit_command == "report":
        return run_audit_report(
            args.files,
            html=args.html,
            config=args.config,
            metrics=args.metrics,
            request_id=args.request_id,
        )
    if args.command == "audit":
        return run_audit_verify(args.files, args.prev)
    if args.command == "extproc":
        return run_extproc(args)
    try:
        config = serve_config(args) if args.command == "serve" else check_config(args)
    except ConfigError as exc:
        say(exc.problems)
        if args.command == "serve":
            _failed(args, "; ".join(exc.problems))
        return 2
    if args.command == "serve":
        return run_serve(config, args)
    return run_check(
        args.files,
        config,
        as_json=args.json,
        ledger=args.ledger,
        tenant=args.tenant,
        vendor=args.vendor,
    )


def check_config(args: argparse.Namespace) -> Config:
    return load_config(args.config) if args.config else Config()


def serve_config(args: argparse.Namespace) -> Config:
    """The config file, the REPLAY_PROXY_* variables over it, the flags over those, and the
    upstream key from the environment."""
    config = load_config(args.config) if args.config else Config()
    config = with_environment(config, os.environ, args)
    config = config.with_overrides(upstream=args.upstream, host=args.host, port=args.port)
    return config.with_secrets(os.environ)


# Why more than one worker needs the Redis ledger, and the fix, in one line.
_PER_PROCESS_LEDGER = (
    "the memory ledger is each worker's own, so a follow-up turn (previous_response_id) "
    "landing on another worker than its first turn would miss it: set ledger.backend: redis"
)


# The variables a container sets instead of flags, by the flag's attribute in the arguments.
VARIABLES = {
    "upstream": "REPLAY_PROXY_UPSTREAM_URL",
    "host": "REPLAY_PROXY_LISTEN_HOST",
    "port": "REPLAY_PROXY_LISTEN_PORT",
}


def with_environment(
    config: Config, environ: Mapping[str, str], args: argparse.Namespace
) -> Config:
    """`config` with each REPLAY_PROXY_* variable that is set (and not empty) over its key,
    unless the variable's flag was given: flags > environment > file. A value is checked as
    its flag's would be; a bad one names the variable."""
    parsers: dict[str, Callable[[str], Any]] = {"upstream": str, "host": host, "port": port}
    found: dict[str, Any] = {}
    for attribute, variable in VARIABLES.items():
        value = environ.get(variable)
        if value and getattr(args, attribute) is None:
            try:
                found[attribute] = parsers[attribute](value)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"{variable}: {exc}") from None
    try:
        return config.with_overrides(**found)
    except ConfigError as exc:
        raise ConfigError(
            str(exc).replace("--upstream: ", f"{VARIABLES['upstream']}: ", 1)
        ) from None


def run_serve(config: Config, args: argparse.Namespace) -> int:
    # Imported here so that `check` never loads the HTTP stack.
    from proxy.running.logs import configure_logging
    from proxy.running.serving import serve
    from proxy.running.workers import free_port, supervise

    if args.workers > 1 and config.ledger.backend == "memory":
        say([f"--workers {args.workers}: {_PER_PROCESS_LEDGER}"])
        return 2
    configure_logging(args.log_level, args.log_format or config.log.format)
    if args.worker_slot is None:  # the supervisor's, or the one process's: said once
        for warning in iter_warnings(config):
            logging.getLogger("replay_proxy").warning("%s", warning)
    if args.workers > 1 and args.worker_slot is None:
        port = config.listen.port or free_port(config.listen.host)
        worker_args = ["--host", config.listen.host, "--port", str(port), "--reuse-port"]
        worker_args += ["--log-level", args.log_level, "--workers", str(args.workers)]
        if args.log_format:
            worker_args += ["--log-format", args.log_format]
        if args.config:
            worker_args += ["--config", args.config]
        if args.upstream:
            worker_args += ["--upstream", args.upstream]
        return supervise(worker_args, args.workers)
    try:
        served = serve(
            config,
            reuse_port=args.reuse_port,
            reload=lambda: serve_config(args),
            worker=_worker_of(args),
            metrics_dir=metrics_dir(),
            workers=args.workers,
        )
        asyncio.run(served)
    except ConfigError as exc:
        problems = [blame_flags(problem, args) for problem in exc.problems]
        say(problems)
        _failed(args, "; ".join(problems))
        return 2
    except OSError as exc:  # one no key accounts for
        logging.getLogger("replay_proxy").error("cannot serve: %s", exc)
        _failed(args, f"cannot serve: {exc}")
        return 1
    return 0


def metrics_dir() -> str | None:
    """The multiprocess directory of the environment, if any: set by the supervisor of
    `--workers N` (or the operator's own), where every process's metrics meet, so that a scrape
    of any of them reads the whole service. ConfigError when it is not a directory."""
    from proxy.running.workers import MULTIPROC_ENV

    found = os.environ.get(MULTIPROC_ENV)
    if found is not None and not os.path.isdir(found):
        raise ConfigError(f"{MULTIPROC_ENV}: {found!r} is not a directory")
    return found


def _worker_of(args: argparse.Namespace) -> WorkerSlot | None:
    if args.worker_dir is None or args.worker_slot is None:
        return None
    return WorkerSlot(args.worker_dir, args.worker_slot)


def _failed(args: argparse.Namespace, reason: str) -> None:
    """A worker that cannot start tells its supervisor why."""
    worker = _worker_of(args)
    if worker is not None:
        with suppress(OSError):  # the supervisor is gone: no one to tell
            worker.failed(reason)


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
    from proxy.running.logs import configure_logging

    try:
        config = check_config(args)
        configure_logging(args.log_level, args.log_format or config.log.format)
        listen = args.listen or config.extproc.listen
        asyncio.run(serve_extproc(config, listen, metrics_dir()))
    except ConfigError as exc:
        if args.listen is None:
            say(exc.problems)
        else:
            say([p.replace("extproc.listen: ", "--listen: ", 1) for p in exc.problems])
        return 2
    return 0


# The flags that stand for a config key: a start-up failure of a key set by its flag (or else
# by the flag's REPLAY_PROXY_* variable) names that.
_FLAGS = {"listen.host": ("host", "--host"), "listen.port": ("port", "--port")}


def blame_flags(message: str, args: argparse.Namespace) -> str:
    key, _, rest = message.partition(": ")
    attribute, flag = _FLAGS.get(key, (None, None))
    if attribute is not None and getattr(args, attribute) is not None:
        return f"{flag}: {rest}"
    if attribute is not None and os.environ.get(VARIABLES[attribute]):
        return f"{VARIABLES[attribute]}: {rest}"
    return message


def say(problems: Sequence[str]) -> None:
    """Problems on stderr, one line each."""
    sys.stderr.write("".join(f"replay-proxy: {problem}\n" for problem in problems))


def run_config_check(path: str, *, connect: bool = False) -> int:
    """Exit 2 naming every mistake of the file; else its warnings (exit 0), and with `connect`
    what cannot be reached (exit 1)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        say(exc.problems)
        return 2
    say([f"{path}: warning: {warning}" for warning in iter_warnings(config)])
    if connect:
        unreachable = [f"{path}: {problem}" for problem in iter_unreachable(config)]
        if unreachable:
            say(unreachable)
            return 1
    sys.stdout.write(f"{path}: ok\n")
    return 0


def run_defaults() -> int:
    sys.stdout.write("".join(line + "\n" for line in iter_defaults()))
    return 0


CHECK_DESCRIPTION = f"""\
Gate what was logged, as the proxy would have. Each FILE is one JSON value or JSON Lines of
them; each value is found as one of: a request body (or a JSON array of them, or a bare
array of input items); a log line wrapping a request under {", ".join(WRAPPERS)} (nested, as
an object or a JSON string, with the answer beside it under response); a response object (its
output calls against its request's tools, else the pinned schemas); an input_items list
({{"object": "list", "data": [...]}}); an audit record (its findings, judged again when it kept
the arguments); a Chat Completions body (an envelope finding). A follow-up's outputs pair
with the calls of the previous response only through the proxy's ledger: --ledger reads a
Redis one.

exit codes: 0 every document read and clean, 1 findings, 2 some input unreadable (named on
stderr; the rest is still checked) or a usage or config mistake."""


def run_check(
    paths: Sequence[str],
    config: Config,
    *,
    as_json: bool,
    ledger: str | None = None,
    tenant: str = "-",
    vendor: str | None = None,
) -> int:
    policy = config.gate if vendor is None else replace(config.gate, vendor=vendor)
    if ledger is None:
        return check_files(paths, Checker(policy), as_json=as_json)
    from proxy.running.check_ledger import LedgerFault, LedgerReader

    try:
        reader = LedgerReader(
            ledger, tenant, config.ledger, provenance=config.gate.require_provenance
        )
    except LedgerFault as exc:
        print(f"replay-proxy: --ledger: cannot read {ledger}: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    try:
        code = check_files(paths, Checker(policy, reader.recorded), as_json=as_json)
    finally:
        reader.close()
    if reader.faults:
        print(  # noqa: T201
            f"replay-proxy: --ledger: {reader.faults} read(s) failed: their outputs were judged "
            "as if nothing was recorded",
            file=sys.stderr,
        )
        return 2
    return code


def check_files(paths: Sequence[str], checker: Checker, *, as_json: bool) -> int:
    tally = CheckTally()
    for path in paths:
        for name, data in _read_inputs(path):
            if isinstance(data, UnreadableDocument):
                tally.unreadable += 1
                sys.stdout.flush()
                print(report_unreadable(data), file=sys.stderr)  # noqa: T201
                continue
            for document in iter_documents(name, data):
                if isinstance(document, UnreadableDocument):
                    tally.unreadable += 1
                    sys.stdout.flush()
                    print(report_unreadable(document), file=sys.stderr)  # noqa: T201
                    continue
                checked = checker.check(document)
                tally.add(checked)
                lines = iter_json(checked) if as_json else iter_lines(checked)
                sys.stdout.write("".join(line + "\n" for line in lines))
    if not as_json and tally.documents:
        sys.stdout.write("".join(line + "\n" for line in iter_summary(tally)))
    return tally.exit_code()


def _read_inputs(path: str) -> Iterator[tuple[str, bytes | UnreadableDocument]]:
    """The bytes of `-` (stdin), of a file, or of each file a glob matches, in name order."""
    if path == "-":
        yield "<stdin>", sys.stdin.buffer.read()
        return
    names = [path]
    if glob.has_magic(path) and not os.path.exists(path):
        names = sorted(glob.glob(path, recursive=True))
        if not names:
            yield path, UnreadableDocument(path, None, "no file matches")
            return
    for name in names:
        try:
            with open(name, "rb") as f:
                yield name, f.read()
        except OSError as exc:
            yield name, UnreadableDocument(name, None, f"cannot read: {exc.strerror}")


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


def ledger_url(value: str) -> str:
    """An argparse type: the URL of a Redis ledger."""
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a Redis URL (redis://host:port/db, rediss:// or unix://)"
        )
    return value


def vendor_slug(value: str) -> str:
    """An argparse type: a vendor slug, as an upstream's `vendor` spells it."""
    try:
        Policy(vendor=value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("vendor: ")) from None
    return value


def chain_hash(value: str) -> str:
    """An argparse type: a sha256 hex digest, as `prev` carries it."""
    digest = value.lower()
    if len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a sha256 hex digest")
    return digest


def run_audit_verify(paths: Sequence[str], start: str) -> int:
    start_name = "a fresh chain's start (64 zeros)" if start == GENESIS else "the --prev hash"
    chains: dict[str, tuple[str, str]] = {}
    initial = start
    for path in paths:
        name = "<stdin>" if path == "-" else path
        try:
            with _open_binary(path) as f:
                chain = verify(f, start, start_name=start_name, chains=chains)
        except OSError as exc:
            print(f"replay-proxy: {name}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
            return 2
        if chain.broken is not None:
            sys.stdout.write(f"{name}: line {chain.broken.line}: {chain.broken.reason}\n")
            return 1
        if not chain.chains:
            sys.stdout.write(f"{name}: ok, {chain.records} records, last hash {chain.last}\n")
        else:
            # Several processes on stdout: a chain each, and the last hash of each.
            lasts = [("(unnamed)", chain.last)] if chain.last != initial else []
            lasts += sorted(chain.chains.items())
            sys.stdout.write(
                f"{name}: ok, {chain.records} records in {len(lasts)} chains, last hashes "
                + ", ".join(f"{chain_name} {last}" for chain_name, last in lasts)
                + "\n"
            )
        # The next file must continue from this one.
        start, start_name = chain.last, f"the last hash of {name}"
        chains = {
            c: chains[c]
            if c in chains and chains[c][0] == last
            else (last, f"the last hash of chain {c} in {name}")
            for c, last in chain.chains.items()
        }
    return 0


def run_audit_report(
    paths: Sequence[str],
    *,
    html: str | None = None,
    config: str | None = None,
    metrics: str | None = None,
    request_id: str | None = None,
) -> int:
    """Exit 0 when every line was a record, 1 when some were not (named, the rest counted),
    2 when a file cannot be read. With `request_id`: 0 when a record has it, 1 when none has."""
    names = ["<stdin>" if path == "-" else path for path in paths]
    entries: list[Entry | UnreadableLine] = []
    for path, name in zip(paths, names, strict=True):
        try:
            with _open_binary(path) as f:
                entries.extend(iter_entries(name, f))
        except OSError as exc:
            print(f"replay-proxy: {name}: cannot read: {exc.strerror}", file=sys.stderr)  # noqa: T201
            return 2
    if request_id is not None:
        found = [render_record(entry) for entry in find_records(entries, request_id)]
        sys.stdout.write("".join(found))
        if not found:
            print(f"replay-proxy: no record has request_id {request_id!r}", file=sys.stderr)  # noqa: T201
        return 0 if found else 1
    try:
        tenants = load_config(config).tenants if config is not None else {}
        judged = None
        if metrics is not None:
            with open(metrics, encoding="utf-8") as scrape:
                judged = read_judged(metrics, scrape.read())
    except ConfigError as exc:
        say(exc.problems)
        return 2
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"replay-proxy: {metrics}: --metrics: {reason}", file=sys.stderr)  # noqa: T201
        return 2
    summary = summarize(names, entries, tenants=tenants, judged=judged)
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
