"""The options every `panamera` command takes, wherever they are written: `-v`, `-q`, `--debug`.

`PanameraGroup` adds them to itself, to every command made with its `command()` decorator and to
its subgroups, so `panamera -v run ...` and `panamera run ... -v` mean the same. Each occurrence
adds to one setting held by the invocation (click's `ctx.meta`, shared by the nested contexts),
and the logging is configured from it (logs.configure) before the command runs:

    (none)   progress and info lines on stderr (a bar on a terminal)
    -q       warnings and errors only
    -v       also every stage and its time (the debug log)
    --debug  -v, and a traceback instead of a one-line error (`main` reads it too)

>>> from click.testing import CliRunner
>>> @click.group(cls=PanameraGroup)
... def tool(): pass
>>> @tool.command()
... def hello(): print(verbosity())
>>> CliRunner().invoke(tool, ["hello", "-v"]).output
'debug\\n'
"""

from __future__ import annotations

import click

from . import logs

_KEY = "panamera.verbosity"


def _setting(ctx: click.Context) -> dict:
    return ctx.meta.setdefault(_KEY, {"verbose": 0, "quiet": False, "debug": False, "reset": False})


def verbosity(ctx: click.Context | None = None) -> logs.Verbosity:
    """The verbosity the options of this invocation asked for (NORMAL outside a command)."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return logs.Verbosity.NORMAL
    s = _setting(ctx)
    if s["debug"] or s["verbose"]:
        return logs.Verbosity.DEBUG
    return logs.Verbosity.QUIET if s["quiet"] else logs.Verbosity.NORMAL


def _callback(ctx: click.Context, param: click.Parameter, value) -> None:
    if ctx.resilient_parsing:
        return
    s = _setting(ctx)
    if not s.get("reset"):  # the root context closes when the command is done
        s["reset"] = True
        ctx.find_root().call_on_close(logs.reset)
    if param.name == "verbose":
        s["verbose"] += value or 0
    else:
        s[param.name] = s[param.name] or bool(value)
    logs.configure(verbosity(ctx))


def common_params() -> list[click.Option]:
    """New -v / -q / --debug options (one set per command: click params are not shared)."""
    return [
        click.Option(
            ["-v", "--verbose"], count=True, expose_value=False, callback=_callback,
            help="say more on stderr: every stage and its time (the debug log)",
        ),
        click.Option(
            ["-q", "--quiet"], is_flag=True, expose_value=False, callback=_callback,
            help="say nothing on stderr but warnings and errors (no progress)",
        ),
        click.Option(
            ["--debug"], is_flag=True, expose_value=False, callback=_callback,
            help="as -v, and show tracebacks instead of one-line errors",
        ),
    ]  # fmt: skip


class PanameraCommand(click.Command):
    """A command with the common options."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(common_params())


class PanameraGroup(click.Group):
    """A group with the common options, whose commands and subgroups have them too."""

    command_class = PanameraCommand
    group_class = type  # subgroups are PanameraGroups

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(common_params())
