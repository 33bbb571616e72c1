"""`npubuild completion bash|zsh`: print a shell completion script, made from the parser itself
(commands, their options, every choice: stages, chips, actions) plus the recipe field paths
``-S`` takes. No dependency: zsh runs the bash script through ``bashcompinit``.

    eval "$(npubuild completion bash)"      # in ~/.bashrc
    eval "$(npubuild completion zsh)"       # in ~/.zshrc
"""

from __future__ import annotations

import argparse

from npubuild.commands.output import EXIT_OK

NAME = "completion"
HELP = "print a shell completion script: eval \"$(npubuild completion bash)\" (or zsh)"
OPTIONS = {"recipe": False}
SHELLS = ("bash", "zsh")


def add_arguments(p) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def run(args) -> int:
    from npubuild.cli import build_parser

    print(script(build_parser(), args.shell), end="")
    return EXIT_OK


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell``: one case per command."""
    commands = _subcommands(parser)
    top = " ".join([*commands, *_options(parser)])
    cases = []
    for name, sub in commands.items():
        options = " ".join(_options(sub))
        words = " ".join(w for action in sub._actions if not action.option_strings
                         and action.choices for w in action.choices)
        cases.append(f'    {name}) opts="{options}"; words="{words}";;')
    choices = []
    for name, sub in commands.items():
        for action in sub._actions:
            for option in action.option_strings:
                values = _values_for(option, action)
                if values:
                    glue = "compopt -o nospace 2>/dev/null; " if option in ("-S", "--set") else ""
                    choices.append(f'    "{name} {option}") {glue}COMPREPLY=($(compgen -W '
                                   f'"{values}" -- "$cur")); return;;')
    body = BASH.format(top=top, cases="\n".join(cases), choices="\n".join(choices))
    return (ZSH_PRELUDE if shell == "zsh" else "") + body


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]


def _values_for(option: str, action: argparse.Action) -> str:
    """What follows an option: its choices, the chips (--target), recipe fields (-S)."""
    if action.choices:
        return " ".join(map(str, action.choices))
    if option == "--target":
        from npubuild.targets import preset_names

        return " ".join(preset_names())
    if option in ("-S", "--set"):
        return " ".join(f"{path}=" for path in recipe_fields())
    return ""


def recipe_fields() -> list[str]:
    """Every dotted field path of the recipe schema that holds a value (``verify.min_cosine``),
    for ``-S`` (list items and mappings of free keys are left to the user)."""
    from pydantic import BaseModel

    from npubuild.recipe.model import Recipe

    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, info in model.model_fields.items():
            inner = [t for t in getattr(info.annotation, "__args__", (info.annotation,))
                     if isinstance(t, type) and issubclass(t, BaseModel)]
            path = f"{prefix}{name}"
            out += walk(inner[0], f"{path}.") if inner else [path]
        return out

    return walk(Recipe, "")


ZSH_PRELUDE = """autoload -U +X bashcompinit && bashcompinit
"""

BASH = """_npubuild() {{
  local cur prev cmd w opts words
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  cmd=""
  for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
    case "$w" in -*) ;; *) cmd="$w"; break;; esac
  done
  if [ -z "$cmd" ]; then
    COMPREPLY=($(compgen -W "{top}" -- "$cur")); return
  fi
  case "$cmd $prev" in
{choices}
    *" --build-dir"|*" --cache"|*" --base-build-dir") COMPREPLY=($(compgen -d -- "$cur")); return;;
  esac
  case "$cmd" in
{cases}
    *) opts=""; words="";;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$words" -- "$cur") $(compgen -f -X '!*.@(yaml|yml)' -- "$cur") $(compgen -d -- "$cur"))
  fi
}}
shopt -s extglob 2>/dev/null
complete -o filenames -F _npubuild npubuild
"""
