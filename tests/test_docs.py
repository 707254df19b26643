"""The manual (README.md and docs/*.md) stays true: every relative link resolves (anchors included), every file and
module it names in code exists, every command block of docs/ says whether a test runs it, every quick block runs, and
every import a Python block shows imports.

The convention: a fenced block with info string ``bash`` whose first line is ``# test: quick`` runs here, in a
scratch folder that links the checkout's top-level entries (so that a block reads ``config/``, ``reports/``, ``bin/``
as in the checkout and writes new files only into the scratch folder), with the test's Python environment first on
PATH and the checkout on PYTHONPATH; a quick block must take seconds on a CPU, need no network and no prepared model.
``# test: slow`` marks a block that no test runs (a long job, a model download, a GPU). Every ``bash`` block of
docs/ carries one of the two markers; README.md's quick blocks run too.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# Pages written in other branches, linked from the index before they land: a link to one of them is checked once the
# file exists, and skipped while it does not (exactly these four names, nothing else).
COMING = {DOCS / name for name in ("robustness.md", "reproducing.md", "serving.md", "distributed.md")}
QUICK, SLOW = "# test: quick", "# test: slow"
# Entries of the checkout a quick block's scratch folder does not link: git's, and the pipeline's working folders
# (a block that writes results/ must write them into the scratch folder, not the checkout's).
NOT_LINKED = {".git", "results", "logs", "benchmarks", ".snakemake", ".ci-work", "out", ".pytest_cache"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\"|\s+'[^']*')?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(?P<code>(?:(?!\1).)+)\1")
# What a page names in inline code and this test checks: a path of the repository, or a module of the project with
# an optional attribute (``swiftkv.measure.flops``, ``swiftkv.models.FAMILIES``). Paths with placeholders (<model>, *) are not.
REPO_PATH = re.compile(r"^(?:swiftkv|analysis|tests|workflow|config|bin|reports|notebooks|requirements|docs|\.ci)/"
                       r"[\w./-]*$")
PROJECT_NAME = re.compile(r"^(?:swiftkv|analysis)(?:\.\w+)+$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def marker(self) -> str:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        return first if first in (QUICK, SLOW) else ""


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_page(path: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks of a page and its other lines (number, text)."""
    blocks, prose, open_ = [], [], None
    for number, line in enumerate(path.read_text().split("\n"), start=1):
        match = FENCE.match(line)
        if open_ is None:
            if match:
                open_ = (number, match["fence"], match["info"], len(match["indent"]), [])
            else:
                prose.append((number, line))
        elif match and match["fence"][0] == open_[1][0] and len(match["fence"]) >= len(open_[1]) and not match["info"]:
            start, _, info, indent, body = open_
            blocks.append(Block(path, start, info, "\n".join(dedent(x, indent) for x in body)))
            open_ = None
        else:
            open_[4].append(line)
    assert open_ is None, f"{path.relative_to(ROOT)}:{open_[0]}: a fenced block is never closed"
    return blocks, prose


def dedent(line: str, indent: int) -> str:
    """A line of a block whose fence is indented by ``indent`` (in a list item), without that indentation."""
    return line[indent:] if line[:indent].isspace() else line.lstrip() if indent else line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens kept), spaces to hyphens."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in split_page(path)[1]:
        match = HEADING.match(line)
        if match:
            base = slug(match["text"])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in split_page(path)[1]:
        line = CODE_SPAN.sub("``", line)  # inline code is not a link
        out += [(number, m["target"]) for m in LINK.finditer(line)]
        ref = REFERENCE.match(line)
        if ref:
            out.append((number, ref["target"]))
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...: not checked here
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if file_part and resolved in {c.resolve() for c in COMING} and not resolved.exists():
            continue
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where} (no heading with anchor #{anchor})")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_skips_only_an_absent_coming_page(tmp_path,
                                                                                                  monkeypatch):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page.write_text("[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1) [ok](#own)\n"
                    "# Own\n[bad](missing.md) [bad](there.md#nowhere) `[code](not-a-link.md)`\n"
                    "[web](https://example.org/x.md) [coming](soon.md) [coming](gone.md)\n"
                    "```bash\n[in a block](not-a-link.md)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "COMING", {tmp_path / "soon.md"})
    assert broken_links(page) == ["page.md:3: missing.md (no such file)",
                                  "page.md:3: there.md#nowhere (no heading with anchor #nowhere)",
                                  "page.md:4: gone.md (no such file)"]


def test_the_index_lists_every_page_of_docs_and_the_pages_coming_from_other_branches():
    index = DOCS / "README.md"
    listed = {(index.parent / target.partition("#")[0]).resolve() for _, target in links(index)}
    missing = [p.name for p in [*DOCS.glob("*.md"), *COMING] if p != index and p.resolve() not in listed]
    assert missing == [], f"docs/README.md does not link {missing}"


def names_in_code(path: Path) -> list[tuple[int, str]]:
    return [(number, m["code"].strip()) for number, line in split_page(path)[1] for m in CODE_SPAN.finditer(line)]


def resolves(name: str) -> bool:
    """Whether ``name`` (``package.module`` or ``package.module.attribute``) is importable down to its last part."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_and_module_named_in_code_exists(page):
    """`swiftkv/models/llama.py`, `config/variants.tsv`, `swiftkv.models.FAMILIES`: a rename that leaves a page behind
    fails here, not in a reader's hands."""
    gone = [f"{page.relative_to(ROOT)}:{number}: {code}" for number, code in names_in_code(page)
            if (REPO_PATH.match(code) and not (ROOT / code.rstrip("/")).exists())
            or (PROJECT_NAME.match(code) and not resolves(code))]
    assert gone == []


def test_the_name_check_sees_paths_and_modules_and_misses_nothing_it_should_see(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("`config/variants.tsv` `config/nothing.tsv` `swiftkv.models.FAMILIES` `swiftkv.models.NOTHING`\n"
                    "`results/x.json` `reports/<table>.csv` `swiftkv distill`\n")
    named = [code for _, code in names_in_code(page)]
    assert [c for c in named if REPO_PATH.match(c)] == ["config/variants.tsv", "config/nothing.tsv"]
    assert [resolves(c) for c in named if PROJECT_NAME.match(c)] == [True, False]


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in split_page(page)[0]]


def test_every_command_block_of_docs_says_whether_a_test_runs_it():
    unmarked = [b.id for b in all_blocks() if b.page.parent == DOCS and b.info == "bash" and not b.marker]
    assert unmarked == [], f"bash blocks without '{QUICK}' or '{SLOW}' as their first line: {unmarked}"
    shells = [b.id for b in all_blocks() if b.page.parent == DOCS and b.info in ("sh", "shell", "console", "zsh")]
    assert shells == [], f"command blocks must use the info string bash (so that they are marked): {shells}"


QUICK_BLOCKS = [b for b in all_blocks() if b.info == "bash" and b.marker == QUICK]


def checkout_state() -> str | None:
    """What git sees of the checkout (tracked changes and untracked files), or None without git."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"], check=False,
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def run_block(block: Block, scratch: Path) -> subprocess.CompletedProcess:
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (scratch / entry.name).symlink_to(entry)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], check=False, cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=300)


def test_there_are_quick_blocks_and_a_failing_one_fails(tmp_path):
    assert len(QUICK_BLOCKS) >= 5
    bad = Block(README, 0, "bash", f"{QUICK}\nswiftkv flops --no-such-option")
    assert run_block(bad, tmp_path).returncode != 0


@pytest.mark.parametrize("block", QUICK_BLOCKS, ids=lambda b: b.id)
def test_quick_block_runs(block, tmp_path):
    before = checkout_state()
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block.id} failed ({done.returncode}):\n{block.code}\n{done.stdout[-2000:]}" \
                                 f"\n{done.stderr[-2000:]}"
    assert checkout_state() == before, f"{block.id} changed the checkout (a quick block writes new files only)"


def shown_imports(block: Block) -> list[tuple[str, str | None]]:
    tree = ast.parse(block.code)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name) for a in node.names]
    return out


def test_every_import_a_python_block_shows_works():
    """The imports README.md and docs/ show (``import swiftkv``, ``from swiftkv.x import y``) keep working."""
    blocks = [b for b in all_blocks() if b.info == "python"]
    assert blocks, "no python block found"
    broken = []
    for block in blocks:
        for module, name in shown_imports(block):
            if module.split(".")[0] not in ("swiftkv", "analysis"):
                continue
            shown = f"from {module} import {name}" if name else f"import {module}"
            try:
                imported = importlib.import_module(module)
                if name is not None and not hasattr(imported, name):
                    importlib.import_module(f"{module}.{name}")  # a submodule of that name, if not an attribute
            except ImportError as err:
                broken.append(f"{block.id}: {shown} ({err})")
    assert broken == []
