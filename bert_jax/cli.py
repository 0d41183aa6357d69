"""How every entry point ends on an error: one line, `error: <message>`, on stderr, and the
exit code of the error's kind (bert_jax.errors: 2 for the user's mistake, 1 for a fault);
`--verbose` adds the traceback. Anything that is not a reported error is a bug and keeps its
traceback.

    if __name__ == "__main__":              # absl programs (launch/train.py, data_prep/...)
        cli.run(main)                       # also turns bad flags into one line
    # argparse programs (python -m bert_jax.convert):
    with cli.reported(args.verbose):
        args.fn(args)

A bad flag (absl's own errors, and ml_collections' `--config.<key>` errors, raised while
flags are parsed, before main) is a user's mistake: one line, exit 2.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import traceback
from typing import Callable, Iterator, Optional, Sequence

from bert_jax.errors import ReportedError, UserError

VERBOSE_HELP = "On an error, print its traceback too (default: one line)."


def quiet_native_logs() -> None:
    """Called by each command before TensorFlow loads: without it TensorFlow's C++ side
    prints its start-up notices (absl's pre-init warning, "oneDNN custom operations are
    on") on every run, twice when data_prep's workers start. TF_ENABLE_ONEDNN_OPTS=0
    changes only TensorFlow's own CPU math kernels, which these commands never run (they
    read and write records with it). Values the user set are kept."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


class ErrorExit(SystemExit):
    """SystemExit(exit_code) once the error's line is printed; str() is that message (so a
    caller of a CLI's main can match it, as with SystemExit("error: ...") before)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(exit_code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def fail(message: str, exit_code: int, exc: Optional[BaseException] = None,
         verbose: bool = False) -> None:
    """Prints `error: message` (after the traceback of `exc` when verbose) and exits."""
    if verbose and exc is not None:
        traceback.print_exception(exc)
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise ErrorExit(message, exit_code)


@contextlib.contextmanager
def reported(verbose: bool = False,
             also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turns a ReportedError (and the exception types in `also`, counted as the user's
    mistakes: exit 2) raised inside the block into one line and its exit code; Ctrl-C into
    "error: interrupted", exit 130."""
    try:
        yield
    except ReportedError as e:
        fail(one_line(e), e.exit_code, e, verbose)
    except also as e:  # noqa: B030  (an empty tuple catches nothing)
        fail(one_line(e), UserError.exit_code, e, verbose)
    except KeyboardInterrupt as e:  # Ctrl-C: what the program saved is said by the program
        fail("interrupted", 130, e, verbose)


def _verbose_in(argv: Sequence[str]) -> bool:
    """--verbose before absl has parsed it (a flag error happens while parsing)."""
    value = False
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg == "--verbose":
            value = True
        elif arg == "--noverbose":
            value = False
        elif arg.startswith("--verbose="):
            value = arg.split("=", 1)[1].lower() in ("1", "true", "t", "yes", "y")
    return value


def innermost(e: BaseException) -> BaseException:
    """The exception at the bottom of e's chain (`raise ... from` or raised while handling):
    flag parsers re-raise the config file's own error wrapped in theirs, traceback and all."""
    seen = {id(e)}
    while True:
        nxt = e.__cause__ or e.__context__
        if nxt is None or id(nxt) in seen:
            return e
        seen.add(id(nxt))
        e = nxt


def one_line(e: BaseException) -> str:
    """The message of `e` on one line (its lines joined by "; "); a KeyError's own text, not
    its repr."""
    text = str(e.args[0]) if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def parse_flags(argv: list[str], diagnose: Optional[Callable[[list[str]], None]] = None
                ) -> list[str]:
    """absl's flag parsing, every failure one line and exit 2. `diagnose(argv)` runs on a
    failure: it raises a ReportedError that names the key or file (a `--config.<key>` the
    config does not have), or returns and the parser's own error is shown."""
    from absl import flags

    verbose = _verbose_in(argv)
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001  ml_collections' config flags raise plain errors
        if diagnose is not None:
            try:
                diagnose(argv)
            except ReportedError as d:
                fail(str(d), d.exit_code, d, verbose)
            except Exception:  # noqa: BLE001  the diagnosis failed too: show the parser's
                pass
        # absl's own errors are one line naming the flag; ml_collections wraps the config
        # file's own error (get_config's ValueError, traceback in the text): show that one.
        own = isinstance(e, flags.Error) and "Error whilst parsing config file" not in str(e)
        fail(one_line(e if own else innermost(e)), UserError.exit_code, e, verbose)
    raise AssertionError("unreachable")


def run(main: Callable[[list[str]], object], argv: Optional[list[str]] = None,
        diagnose: Optional[Callable[[list[str]], None]] = None,
        also: tuple[type[BaseException], ...] = ()) -> None:
    """absl.app.run(main) with a --verbose flag; flag errors, ReportedError, absl's
    UsageError and the types in `also` (the user's mistakes to this program) end in one
    line each; the process exits right after main (see the gc.freeze below)."""
    from absl import app, flags

    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, VERBOSE_HELP)

    def guarded(args):
        with reported(flags.FLAGS.verbose, also):
            try:
                return main(args)
            except app.UsageError as e:  # absl would print the whole module docstring
                fail(str(e), UserError.exit_code, e, flags.FLAGS.verbose)
            finally:
                # The work is done (files closed, checkpoints waited for): no collector
                # needs to look at what is alive now. Without this the interpreter's last
                # collections, while it shuts down, walk the objects of TensorFlow, JAX
                # and flax several times: seconds after the last line, more under load
                # (benchmarks/RESULTS.md). Exit still runs atexit handlers and joins threads.
                gc.freeze()

    app.run(guarded, argv=argv, flags_parser=lambda a: parse_flags(a, diagnose))
