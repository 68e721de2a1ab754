"""The ``hypsearch`` command line run in this process: its exit status (also for
argparse's own errors, which raise ``SystemExit``) and its one-line errors."""

from __future__ import annotations


def cli_status(argv: list[str]) -> int:
    """``service.cli.main(argv)``'s exit status, also for argparse errors."""
    from service.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def one_line_error(capsys, code: int, *needles: str) -> None:
    """The command exited 2 with one line on stderr that holds every needle."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
