"""Every command the README and docs/ show runs as written: at least, it parses.

Extracts each command line from README.md and docs/*.md (fenced shell blocks, and inline spans that start with
`python -m`, `.venv/bin/python`, `make` or `pytest`: a span without options, or cut short with `...`, names a command
and only what it shows is checked), then checks it without running it:
`python -m routerlab ...` against the real argparse parser (`bench load ...` and `python -m routerlab.bench.load ...`
against the harness's own), `python -m MODULE` that the module exists, `app.py` that its options are app.py's,
`make X` that the Makefile has the target, and a test file named to pytest that it exists. The lesson
(docs/workshop.md) is covered like every other page. Reads text only: no model loads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from routerlab.core.base.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHONS = ("python", "python3", ".venv/bin/python")
PROGRAMS = (*PYTHONS, "make", "pytest", ".venv/bin/pytest")
# Fenced blocks in these languages hold code or data, not shell commands.
NOT_SHELL = ("python", "py", "json", "text", "yaml", "toml")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def _blocks_blanked(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The text with fenced blocks blanked (line numbers kept), and each shell block's lines (number, line): a line
    ending in a backslash is joined with the next."""
    out, shell, lang, inside, pending = [], [], "", False, None
    for n, line in enumerate(text.splitlines(), 1):
        fence = line.strip().startswith("```")
        if fence:
            inside, lang = (not inside), line.strip()[3:].strip().lower()
            out.append("")
            continue
        out.append("" if inside else line)
        if not inside or lang in NOT_SHELL:
            continue
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        else:
            pending = (n, line.strip())
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
            continue
        shell.append(pending)
        pending = None
    return "\n".join(out), shell


def _words(line: str) -> list[list[str]]:
    """The commands of a shell line (split at && and ;), each without its leading VAR=value words; a line that is no
    command (a diagram, a formula) gives none."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: only an error if it looks like a command
        return [["<unparseable>", line]] if line.split()[:1] and line.split()[0] in PROGRAMS else []
    commands, current = [], []
    for w in words + ["&&"]:
        if w in ("&&", ";", "||"):
            while current and ENV.match(current[0]):
                current = current[1:]
            if current and current[0] in PROGRAMS:
                commands.append(current)
            current = []
        else:
            current.append(w)
    return commands


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where: 'docs/x.md:12', words) for every command line in README.md and docs/*.md."""
    found = []
    for path in DOCS:
        name = path.relative_to(ROOT).as_posix()
        prose, shell = _blocks_blanked(path.read_text(encoding="utf-8"))
        for n, line in shell:
            found += [(f"{name}:{n}", words) for words in _words(line)]
        for m in re.finditer(r"`([^`]+)`", prose):
            span = " ".join(m.group(1).split())  # a span may wrap onto the next line
            plain = [w for w in span.split() if not ENV.match(w)]  # `VAR=1 python -m ...`: the command after the settings
            if not plain or plain[0] not in PROGRAMS or len(plain) < 2:
                continue  # `make` alone names the tool; `python` alone the language
            n = prose.count("\n", 0, m.start()) + 1
            found += [(f"{name}:{n}", _named(words)) for words in _words(span)]
    return found


NAMED = "<names a command>"  # appended to an inline span that names a command rather than spelling out a run of it


def _named(words: list[str]) -> list[str]:
    """An inline span with no option (`python -m routerlab train`) or cut short (`train-job --minutes 3 ...`) names a
    command in prose: what it shows must exist, the rest of a run is not there to parse."""
    for cut in ("...", "…"):
        if cut in words:
            return words[: words.index(cut)] + [NAMED]
    return words + [NAMED] if not any(w.startswith("-") and w != "-m" for w in words[1:]) else words


def _parse(parser, args: list[str]) -> str | None:
    """None when argparse takes `args`; else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # 0: --help
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit_.code}"
    return None


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.M))


def _app_options() -> set[str]:
    return {"--help", *re.findall(r"add_argument\(\"(--[\w-]+)\"", (ROOT / "app.py").read_text())}


def problem(words: list[str]) -> str | None:
    """What is wrong with one command, or None."""
    from routerlab.__main__ import build_parser
    from routerlab.bench.load.cli import build_parser as load_parser

    named = words[-1] == NAMED
    program, args = words[0], [w for w in words[1:] if w != NAMED]
    if named and program in PYTHONS:  # it exists if argparse can show its help (required options may be left out)
        args = [*args, "--help"]
    if program == "<unparseable>":
        return f"unbalanced quotes: {args[0]}"
    if program == "make":
        missing = [t for t in args if not t.startswith("-") and "=" not in t and t not in _makefile_targets()]
        return f"no Makefile target {', '.join(missing)}" if missing else None
    if program in ("pytest", ".venv/bin/pytest"):
        args = ["-m", "pytest", *args]
    if args[:1] == ["-m"] and len(args) >= 2:
        module, rest = args[1], args[2:]
        if module == "routerlab":
            said = _parse(build_parser(), rest)
            if said is None and rest[:2] == ["bench", "load"]:
                said = _parse(load_parser(), rest[2:])
            return said
        if module == "routerlab.bench.load":
            return _parse(load_parser(), rest)
        if module == "pytest":
            files = [a.split("::")[0] for a in rest if a.split("::")[0].endswith(".py") or a.startswith("tests/")]
            missing = [f for f in files if not (ROOT / f).exists()]
            return f"no test file {', '.join(missing)}" if missing else None
        if module.split(".")[0] == "routerlab" and importlib.util.find_spec(module) is None:
            return f"no module {module}"
        return None
    if args[:1] == ["app.py"]:
        unknown = [a.split("=")[0] for a in args[1:] if a.startswith("--") and a.split("=")[0] not in _app_options()]
        return f"app.py has no option {', '.join(unknown)}" if unknown else None
    if args[:1] and args[0].endswith(".py") and not (ROOT / args[0]).exists():
        return f"no script {args[0]}"
    return None


def test_the_docs_show_commands_to_check():
    """The extractor finds what it should: the README's command-line block, inline spans, make targets, the lesson."""
    found = doc_commands()
    where = {w.split(":")[0] for w, _ in found}
    assert {"README.md", "docs/operators.md", "docs/method.md", "docs/results.md"} <= where, where
    lines = [" ".join(words) for _, words in found]
    assert "python -m routerlab bench speed" in lines and "make run" in lines
    assert any(line.startswith("python -m routerlab generate --prompt") for line in lines)
    assert len(found) >= 40, len(found)


def test_the_checks_catch_the_commands_that_were_wrong():
    """Three lines that once went unchecked: a routers folder no line wrote is not a parse error (it runs and fails), so that
    one is checked in test_every_readme_output_folder_is_the_one_it_uses; these two parse wrong or name nothing."""
    assert problem(shlex.split("python -m routerlab -m routerlab generate --prompt Explain")) is not None
    assert problem(shlex.split("python -m routerlab.loadtest serve")) == "no module routerlab.loadtest"
    assert problem(shlex.split("python -m routerlab generate --promt hi")) is not None
    assert problem(["make", "no-such-target"]) == "no Makefile target no-such-target"
    assert problem(shlex.split(".venv/bin/python app.py --colour red")) == "app.py has no option --colour"
    assert problem(shlex.split("python -m routerlab bench load --sessions 4 --no-such-flag")) is not None
    assert problem(shlex.split("python -m routerlab bench load --sessions 4 --generations 8 --out -")) is None


@pytest.mark.parametrize("where, words", doc_commands(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_doc_command_parses(where, words):
    said = problem(words)
    assert said is None, f"{where}: `{shlex.join(words)}`: {said}"


def test_every_readme_output_folder_is_the_one_it_uses():
    """A folder one README command writes (`--out NAME`) is the one the next reads (`--routers NAME`): the README once
    wrote `my-set` and evaluated `my-routers`."""
    readme = [words for where, words in doc_commands() if where.startswith("README.md")]
    written = {w[w.index("--out") + 1] for w in readme if "--out" in w[:-1]}
    read = {w[w.index("--routers") + 1] for w in readme if "--routers" in w[:-1]}
    assert read <= written, f"the README reads {sorted(read - written)} but writes only {sorted(written)}"
