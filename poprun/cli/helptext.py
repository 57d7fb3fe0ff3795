"""
``poprun --help``: the options table, grouped, in PopRun's layout.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

from poprun.planner.option import OPTIONS

USAGE = """usage: poprun [options] program [program args]
       poprun plan [SPEC] [options] [--explain] [--format text|json|toml|dot|sbatch] [-o FILE] [program [args]]
       poprun plan PLAN.json [--explain] [--format text|json|dot] [-o FILE]
       poprun plan --diff OLD.json [SPEC] [options] [--format text|json] [program [args]]
       poprun plan --diff OLD.json NEW.json [--format text|json]
       poprun apply SPEC|PLAN.json [options] [program [args]]
       poprun render [SPEC] [options] [-o FILE.svg|png|dot] [--expand]
       poprun submit [--dry-run] [--wait] [--nodes N] [SPEC] [options] program [args]
       poprun validate SPEC
       poprun vipu-server [--host H] [--port P] [--db FILE] [--ipus N] [--ild-size N]
       poprun ps [--all] [--json]
       poprun logs RUN [--instance N] [-f] [--tail N] [--tag]
       poprun report RUN [--json]
       poprun stop RUN [--timeout SECONDS]
       poprun attach RUN
"""


def render_help() -> str:
    """Return the help text."""
    groups: dict[str, list[str]] = {}
    for option in OPTIONS:
        short = [f for f in option.flags if not f.startswith("--")]
        longs = [f for f in option.flags if f.startswith("--")]
        name = (f"{short[0]} [ {' '.join(longs)} ]" if short and longs else " ".join(option.flags))
        if option.takes_value:
            name += " arg"
        default = f" (default: {option.default})" if option.default else ""
        groups.setdefault(option.group, []).append(f"  {name:<36} {option.help}{default}")
    parts = [USAGE]
    for group, lines in groups.items():
        parts.append(f"{group} options:\n" + "\n".join(lines) + "\n")
    from poprun.planner.setting import help_lines

    parts.append("\n".join(help_lines()) + "\n")
    return "\n".join(parts)
