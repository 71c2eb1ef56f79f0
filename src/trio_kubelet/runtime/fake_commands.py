"""What a container's command does in the fake runtime: how long it runs and how it exits.

A hollow node (``hollow.py``) runs real pods over `FakeRuntime`, so a Job's ``sleep 5`` should
complete after five seconds and ``sh -c 'exit 3'`` should fail with 3, as on containerd.
Only a few shapes are understood; everything else (a server, an unknown binary, an image's
own entrypoint) runs until it is stopped:

* ``sleep N`` (GNU sleep's units s, m, h, d, arguments added up; ``infinity``), ``true``,
  ``false``, and the quick commands below (``echo``, ``date``...: no time, status 0);
* ``sh -c SCRIPT`` (or bash/ash/dash, any path): the script's simple commands separated by
  ``;``, ``&&``, ``||`` or newlines, in order: sleeps add up, ``exit N`` ends it, the last
  command's status is the exit code; a loop (``while``, ``until``, ``for``) or any command
  not understood runs forever.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from .cri.runtime import v1
from .fake import DEFAULT_SCRIPT, ContainerScript

SHELLS = frozenset({"sh", "bash", "ash", "dash"})
LOOPS = frozenset({"while", "until", "for"})
QUICK = frozenset({
    "true", ":", "echo", "printf", "date", "env", "hostname", "id", "pwd", "ls", "cat",
    "test", "[", "touch", "mkdir", "rm", "cp", "mv", "ln", "chmod", "export", "cd", "wc",
})
_SLEEP = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def script_for(config: v1.ContainerConfig) -> ContainerScript:
    """The `ContainerScript` of the container's command and args (see the module docstring)."""
    return script_for_argv([*config.command, *config.args])


def script_for_argv(argv: Sequence[str]) -> ContainerScript:
    if not argv:  # the image's entrypoint: unknown, so a long-running one
        return DEFAULT_SCRIPT
    program = argv[0].rsplit("/", 1)[-1]
    if program in SHELLS and len(argv) >= 3 and argv[1] == "-c":
        return _shell(argv[2])
    outcome = _simple(program, argv[1:])
    if outcome is None:
        return DEFAULT_SCRIPT
    seconds, code = outcome
    return ContainerScript(exit_after=seconds, exit_code=code)


def _simple(program: str, args: Sequence[str]) -> tuple[float, int] | None:
    """(seconds it runs, exit code) of one command; None: it never ends by itself."""
    if program == "sleep":
        seconds = 0.0
        for arg in args:  # GNU sleep adds its arguments up
            if arg == "infinity":
                return None
            match = _SLEEP.match(arg)
            if match is None:
                return 0.0, 1  # "sleep: invalid time interval"
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
        return (seconds, 0) if args else (0.0, 1)
    if program == "false":
        return 0.0, 1
    if program == "exit":
        return 0.0, _exit_code(args)
    if program in QUICK:
        return 0.0, 0
    return None  # a server, or a program not understood


def _exit_code(args: Sequence[str]) -> int:
    try:
        return int(args[0]) % 256 if args else 0
    except ValueError:
        return 2  # the shell's "exit: Illegal number"


def _commands(script: str) -> list[list[str]]:
    """The script's simple commands (quotes respected); raises ValueError on unbalanced quotes."""
    lexer = shlex.shlex(script.replace("\n", ";"), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def _shell(script: str) -> ContainerScript:
    try:
        commands = _commands(script)
    except ValueError:  # unbalanced quotes: the shell's syntax error, before anything runs
        return ContainerScript(exit_after=0.0, exit_code=2)
    elapsed, code = 0.0, 0
    for words in commands:
        if words[0] in LOOPS:
            return DEFAULT_SCRIPT
        program = words[0].rsplit("/", 1)[-1]
        outcome = _simple(program, words[1:])
        if outcome is None:
            return DEFAULT_SCRIPT
        seconds, code = outcome
        elapsed += seconds
        if program == "exit":
            break
    return ContainerScript(exit_after=elapsed, exit_code=code)
