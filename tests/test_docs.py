"""The docs as tests (issue 23, item 16): what README.md and docs/ tell a user to type or
copy must work here, as far as this machine can check it without network or minutes.

- every ``pydory ...`` and ``dory ...`` command line in a shell block parses with the
  command line's own parser (parse only: nothing runs), and every ``./dev X`` names a
  command of the ``dev`` script;
- every repository path they name exists: relative paths in shell blocks, relative links,
  and code spans that name a file of the repository (``docs/...``, ``tests/...``);
- every XML snippet (```` ```xml ```` blocks of docs/*.md) loads with pydory's config
  loader, put into the sample config in place of its element;
- every socket path they name is the one the sample config (docs/pydory.sample.xml) uses,
  or Dory's own (docs/install.md tells Dory's clients how to keep theirs), and Dory's only
  where the line says it is Dory's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pydory import dory_cli
from pydory.cli import build_parser
from pydory.config import load_config, parse_config
from pydory.errors import ConfigError

ROOT = Path(__file__).parents[1]
SAMPLE = ROOT / "docs" / "pydory.sample.xml"
DORY_SAMPLE = ROOT / "tests" / "data" / "dory_conf.xml"
#: The pages whose shell blocks a new user runs first (the issue's scope), and the rest.
FIRST_PAGES = [ROOT / "README.md", ROOT / "docs" / "install.md"]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
#: Made by set-up or a build, not kept in the repository.
GENERATED = (".venv/", ".tools/", ".jars/", "dist/")
#: Placeholders a reader replaces.
PLACEHOLDERS = ("/path/to/", "HOST", "PATH", "FILE", "DIR")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # where its first line is, 1-based
    language: str
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    """The fenced code blocks of a Markdown page (indented ones too, as in a list)."""
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"\s*```(\w*)\s*$", lines[index])
        if opening is None:
            index += 1
            continue
        indent = len(lines[index]) - len(lines[index].lstrip())
        end = index + 1
        while end < len(lines) and not re.match(r"\s*```\s*$", lines[end]):
            end += 1
        body = [
            line[indent:] if line[:indent].isspace() else line for line in lines[index + 1 : end]
        ]
        yield Block(page, index + 2, opening[1], "\n".join(body))
        index = end + 1


def shell_commands(block: Block) -> Iterator[list[str]]:
    """Each simple command of a shell block as its words: continuation lines joined,
    comments dropped, split at ``;``, ``&&``, ``||`` and ``|``; in a block that shows
    prompts (``$ ``), the prompted lines only (the rest is output)."""
    lines = block.text.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    pending = ""
    for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines():
        pending += line + "\n"
        try:
            words = _words(pending)
        except ValueError:  # a quote that a later line closes: read on
            continue
        pending = ""
        yield from words
    assert not pending, f"{block.where()}: an unclosed quote"


def _words(text: str) -> list[list[str]]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in (";", "&&", "||", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def shell_blocks(pages: list[Path]) -> list[Block]:
    return [b for page in pages for b in blocks(page) if b.language in SHELL_LANGUAGES]


REDIRECTION = re.compile(r"\d*(?:<|>|>>)(?:&\d+)?")


def without_redirections(words: list[str]) -> list[str]:
    """``words`` less the shell's redirections (``< FILE``, ``2>&1``, ``>/dev/null``)."""
    kept: list[str] = []
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
        elif REDIRECTION.fullmatch(word):
            skip_next = not word.endswith(tuple("0123456789"))  # 2>&1 has no operand
        elif not REDIRECTION.match(word):
            kept.append(word)
    return kept


def program(words: list[str]) -> tuple[str, list[str]]:
    """The program a command runs and its arguments (past ``sudo`` and ``VAR=value``,
    without redirections)."""
    words = without_redirections(words)
    while words and (words[0] == "sudo" or re.match(r"[A-Z_]+=", words[0])):
        words = words[1:]
    if not words:
        return "", []
    return words[0], words[1:]


# --- commands -----------------------------------------------------------------------------------


def pydory_commands() -> list[tuple[str, str, list[str]]]:
    """(where, program name, arguments) of every pydory or dory command in the docs."""
    found = []
    for block in shell_blocks(PAGES):
        for words in shell_commands(block):
            name, args = program(words)
            base = Path(name).name
            if base in ("pydory", "dory"):
                found.append((block.where(), base, args))
            elif base in ("python", "python3") and args[:2] == ["-m", "pydory"]:
                found.append((block.where(), "pydory", args[2:]))
    return found


def test_the_docs_show_pydory_commands() -> None:
    """The extraction itself works: the README alone shows about ten."""
    readme = [c for c in pydory_commands() if c[0].startswith("README.md")]
    assert len(readme) >= 8, readme


def test_every_pydory_command_in_the_docs_parses(capsys: pytest.CaptureFixture[str]) -> None:
    problems = []
    for where, name, args in pydory_commands():
        if name == "dory":
            try:
                dory_cli.parse(args)
            except dory_cli._Exit as refused:  # TCLAP's parse error: Dory's message
                problems.append(f"{where}: dory {shlex.join(args)}: {refused}")
            continue
        try:
            build_parser().parse_args(args)
        except SystemExit as exited:
            if exited.code != 0:  # --help, --version: 0
                problems.append(f"{where}: pydory {shlex.join(args)}: {capsys.readouterr().err}")
    assert problems == []


def test_every_dev_command_in_the_docs_exists() -> None:
    script = (ROOT / "dev").read_text()
    known = set(re.findall(r"^\s*([a-z-]+)\)", script, re.M))
    used = {
        (block.where(), args[0] if args else "")
        for block in shell_blocks(PAGES)
        for words in shell_commands(block)
        for name, args in [program(words)]
        if name == "./dev"
    }
    assert used, "no ./dev command found in the docs"
    assert [(where, command) for where, command in sorted(used) if command not in known] == []


# --- paths --------------------------------------------------------------------------------------


def repo_path_problem(text: str) -> str | None:
    """Why ``text``, a repository-relative path a page names, is wrong; None if it exists
    or is not one to check (generated, a placeholder, a glob)."""
    path = text.split("#", 1)[0]
    if not path or path.startswith(GENERATED) or any(p in path for p in PLACEHOLDERS):
        return None
    if any(c in path for c in "*?<>{}$"):
        return None
    return None if (ROOT / path).exists() else f"{path} does not exist"


def looks_like_repo_path(word: str) -> bool:
    return (
        "/" in word
        and not word.startswith(("/", "-", "~", "$", "http:", "https:", "file:"))
        and "://" not in word
        and "=" not in word
        and "@" not in word
        and ":" not in word
    )


def test_every_path_in_the_first_pages_shell_blocks_exists() -> None:
    problems = []
    for block in shell_blocks(FIRST_PAGES):
        for words in shell_commands(block):
            for word in words:
                word = word.strip("'\"")
                if looks_like_repo_path(word) and (problem := repo_path_problem(word)):
                    problems.append(f"{block.where()}: {problem}")
    assert problems == []


LINK = re.compile(r"\]\(([^)\s]+)\)")
#: A code span naming a file of this repository (``src/`` alone may be librdkafka's).
CODE_SPAN_PATH = re.compile(r"`((?:docs|tests|src/pydory|jvm|benchmarks|packaging)/[\w./-]+)`")


def test_every_relative_link_and_named_file_exists() -> None:
    problems = []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            resolved = (page.parent / target.split("#", 1)[0]).resolve()
            if not resolved.exists():
                problems.append(f"{page.relative_to(ROOT)}: link {target}")
        for named in CODE_SPAN_PATH.findall(text):
            if problem := repo_path_problem(named):
                problems.append(f"{page.relative_to(ROOT)}: {problem}")
    assert problems == []


# --- config snippets ------------------------------------------------------------------------------


def xml_snippets() -> list[Block]:
    return [b for b in blocks_of_all_pages() if b.language == "xml"]


def blocks_of_all_pages() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def in_the_sample(snippet: str) -> str:
    """The sample config with ``snippet``'s top-level element in place of its own (or
    added before <initialBrokers>)."""
    tag = re.match(r"\s*<(\w+)", snippet)
    assert tag is not None, f"not an element: {snippet[:40]!r}"
    sample = re.sub(r"<!--.*?-->", "", SAMPLE.read_text(), flags=re.S)  # tags in comments
    own = re.compile(rf"<{tag[1]}[\s>].*?</{tag[1]}>", re.S)
    if own.search(sample):
        return own.sub(lambda _: snippet, sample, count=1)
    return sample.replace("<initialBrokers>", f"{snippet}\n    <initialBrokers>", 1)


def test_the_docs_have_config_snippets() -> None:
    assert len(xml_snippets()) >= 5


@pytest.mark.parametrize("snippet", xml_snippets(), ids=Block.where)
def test_every_config_snippet_loads(snippet: Block) -> None:
    text = snippet.text
    if not text.lstrip().startswith(("<doryConfig", "<?xml")):
        text = in_the_sample(text)
    try:
        parse_config(text, source=snippet.where())
    except ConfigError as error:
        pytest.fail(f"{snippet.where()}: {error}")


# --- socket paths -------------------------------------------------------------------------------

SOCKET_PATH = re.compile(r"/[\w./-]*(?:_sock|\.sock)\b")


def test_the_socket_paths_in_the_docs_are_the_sample_configs() -> None:
    """One datagram and one stream path across the docs: the sample config's (the paths
    the systemd unit's RuntimeDirectory makes), or Dory's where a line says so."""
    pydory_paths = {
        load_config(SAMPLE).inputs.unix_datagram.path,
        *re.findall(r'<path value="([^"]*_sock)"', SAMPLE.read_text()),
    }
    dory_paths = set(re.findall(r'<path value="([^"]*_sock)"', DORY_SAMPLE.read_text()))
    assert pydory_paths == {"/run/pydory/input_datagram_sock", "/run/pydory/input_stream_sock"}
    problems = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for path in SOCKET_PATH.findall(line):
                if path in pydory_paths or (path in dory_paths and "Dory" in line):
                    continue
                problems.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert problems == []


# --- claims about defaults ----------------------------------------------------------------------

#: What the docs call each value of ``pydory demo --kafka``.
KAFKA_NAMES = {"kafka": "Apache Kafka", "mock": "mock cluster", "tansu": "Tansu"}


def test_the_demos_default_kafka_is_the_one_the_docs_name() -> None:
    """pipeline.md's demo section and ARCHITECTURE.md name the demo's default broker as
    the command line sets it (they once said the mock cluster, long after it changed)."""
    default = build_parser().parse_args(["demo"]).kafka
    named = KAFKA_NAMES[default]
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    step = re.search(r"^1\. \*\*kafka\*\*: (.*?)(?=^2\. )", pipeline, re.S | re.M)
    assert step is not None, "no '1. **kafka**:' step in pipeline.md's demo section"
    assert re.match(rf"{re.escape(named)}[^.,;]* by default", step[1]), step[1]
    for page in [ROOT / "ARCHITECTURE.md", *PAGES]:
        for claim in re.findall(r"demo defaults to (?:the )?([\w' ]+?)[.,;]", page.read_text()):
            assert named in claim, f"{page.relative_to(ROOT)}: the demo defaults to {claim}"
