"""The command line: ``python -m idem_assets.landing generate|mess|show``."""

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path

from idem_assets.landing.generator import (
    add_bad_passengers,
    add_duplicates,
    add_stray_row,
    correct,
    generate,
    make_stale,
    short_manifest,
)
from idem_assets.landing.layout import (
    LANDING_DIR_ENV,
    TRIPS_DIR,
    default_landing_dir,
)
from idem_assets.landing.reader import (
    LandingFileError,
    ManifestMismatchError,
    MissingLandingFileError,
    _read_manifest,
    landing_fingerprint,
    list_days,
)


def _iso_date(text: str) -> date:
    # Only the command line reads the clock: a day's bytes still depend on the day alone.
    if text == "today":
        return datetime.now(UTC).date()
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date like 2026-01-05") from None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m idem_assets.landing",
        description="Write, damage and list the deterministic taxi-trip landing files.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    root_help = f"landing root (default: ${LANDING_DIR_ENV} or <repo>/.data/landing)"

    gen = commands.add_parser("generate", help="write one original file per day")
    gen.add_argument("--root", type=Path, default=None, help=root_help)
    gen.add_argument("--start", type=_iso_date, required=True, help="first day, YYYY-MM-DD")
    gen.add_argument(
        "--end", type=_iso_date, required=True, help="last day (inclusive), or 'today' (UTC)"
    )
    gen.add_argument("--rows", type=int, default=1000, help="trips per day (default: 1000)")
    gen.add_argument(
        "--missing-only", action="store_true", help="keep the days that already have a file"
    )

    mess = commands.add_parser("mess", help="damage one existing day")
    mess.add_argument("--root", type=Path, default=None, help=root_help)
    mess.add_argument("--day", type=_iso_date, required=True, help="the day to damage")
    kind = mess.add_mutually_exclusive_group(required=True)
    kind.add_argument("--correct", action="store_true", help="rewrite as a corrected file")
    kind.add_argument("--duplicates", type=int, metavar="N", help="append N re-sent trips")
    kind.add_argument("--stray", type=_iso_date, metavar="OTHER_DAY", help="append a stray row")
    kind.add_argument("--bad-passengers", type=int, metavar="N", help="set N passenger counts")
    kind.add_argument("--stale", type=int, metavar="HOURS", help="drop the last HOURS hours")
    kind.add_argument("--short-manifest", type=int, metavar="N", help="declare N rows too few")
    mess.add_argument("--changed", type=int, default=None, help="with --correct (default: 10)")
    mess.add_argument("--removed", type=int, default=None, help="with --correct (default: 5)")

    show = commands.add_parser("show", help="list the days and their manifests")
    show.add_argument("--root", type=Path, default=None, help=root_help)
    return parser


def _describe(root: Path, day: date, path: Path) -> str:
    manifest = _read_manifest(root, day)
    return (
        f"wrote {path}  day={day}  rows={manifest.rows}  version={manifest.version}"
        f"  sha256={manifest.sha256[:12]}"
    )


def _show(root: Path) -> None:
    days = list_days(root)
    if not days:
        print(f"no landing files under {Path(root) / TRIPS_DIR}")
        return
    print(f"{'day':<10}  {'rows':>6}  {'version':>7}  {'sha256':<12}  csv")
    for day in days:
        try:
            manifest = _read_manifest(root, day)
        except ManifestMismatchError:
            print(f"{day.isoformat():<10}  {'?':>6}  {'?':>7}  {'?':<12}  invalid manifest")
            continue
        fingerprint = landing_fingerprint(root, day)
        status = (
            "missing"
            if fingerprint is None
            else "ok"
            if fingerprint == manifest.sha256
            else "differs from manifest"
        )
        print(
            f"{day.isoformat():<10}  {manifest.rows:>6}  {manifest.version:>7}"
            f"  {manifest.sha256[:12]:<12}  {status}"
        )


def _run_mess(parser: argparse.ArgumentParser, args: argparse.Namespace, root: Path) -> Path:
    day: date = args.day
    if not args.correct and (args.changed is not None or args.removed is not None):
        parser.error("--changed and --removed only apply with --correct")
    if args.correct:
        changed = 10 if args.changed is None else args.changed
        removed = 5 if args.removed is None else args.removed
        return correct(root, day, changed=changed, removed=removed)
    if args.duplicates is not None:
        return add_duplicates(root, day, count=args.duplicates)
    if args.stray is not None:
        return add_stray_row(root, day, other_day=args.stray)
    if args.bad_passengers is not None:
        return add_bad_passengers(root, day, count=args.bad_passengers)
    if args.stale is not None:
        return make_stale(root, day, hours=args.stale)
    return short_manifest(root, day, missing=args.short_manifest)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return 0 on success, 2 for bad arguments, 1 for unreadable files."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    root: Path = args.root if args.root is not None else default_landing_dir()
    try:
        if args.command == "generate":
            written = generate(
                root, args.start, args.end, rows=args.rows, missing_only=args.missing_only
            )
            for path in written:
                print(_describe(root, date.fromisoformat(path.name.removesuffix(".csv")), path))
            if args.missing_only:
                kept = (args.end - args.start).days + 1 - len(written)
                print(f"kept {kept} day(s) that already had a file")
        elif args.command == "mess":
            path = _run_mess(parser, args, root)
            print(_describe(root, args.day, path))
        else:
            _show(root)
    except (ValueError, MissingLandingFileError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except LandingFileError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
