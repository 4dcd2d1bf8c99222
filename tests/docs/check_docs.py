#!/usr/bin/env python3
"""Checks README.md and docs/ against the tree and the programs.

  check_docs.py --root DIR --server BIN --cli BIN --load BIN

Links. Every relative link [text](path) and [text](path#anchor) in README.md
and docs/ (docs/runs/ included) must name a file or directory inside the
repository, and an anchor into a .md file must be one of its headings'
GitHub slugs (lowercase; everything but letters, digits, '_', '-' and spaces
dropped; each space a '-'; a repeated heading gets -1, -2, ...) or an
explicit <a id="..."> / <a name="...">.

Flags (README.md and docs/*.md; the older runs in docs/runs/ are history and
are not held to today's flags). The programs are linattn-server,
linattn-load, linattn and each of linattn's subcommands ("linattn explain",
"linattn sessions list", ...), as their --help lists them.

  1. Flag tables. A table preceded by <!-- flag-table: PROGRAM, ... --> lists
     flags of those programs, one row each, the flags in the first cell.
     Every flag in it must be one that each named program's --help prints,
     and, together, the tables naming a program must list every flag its
     --help prints (--help itself excepted). A table whose first header cell
     begins with "flag" must have such a marker.
  2. Commands. In inline code and in code blocks, a command that starts with
     a program (linattn-server, linattn-load, linattn SUBCOMMAND, with or
     without a path, after any VAR=value) may only give flags that program's
     --help prints.
  3. Bare flags. Inline code that starts with a flag (`--state-dir DIR`)
     names a flag of the program of its section: the nearest enclosing
     section heading (## or deeper) that names a program ("linattn-load",
     "linattn generate"; "linattn sessions" covers its subcommands), else the page's
     program: docs/clients.md the clients (linattn and its subcommands,
     linattn-load), every other page linattn-server. A flag of another
     program is written with that program's name (`linattn-load --check`).

Errors are printed as FILE:LINE: message; the exit status is 1 if any.
"""

import argparse
import os
import re
import subprocess
import sys
import unicodedata

SERVER = "linattn-server"
LOAD = "linattn-load"
CLI = "linattn"

FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
HELP_FLAG_RE = re.compile(r"^ {2,4}(?:-[A-Za-z],)?(--[A-Za-z0-9][A-Za-z0-9-]*)")
HELP_SUBCOMMAND_RE = re.compile(r"^  ([a-z][a-z0-9-]*)\s{2,}\S")
LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
MARKER_RE = re.compile(r"<!--\s*flag-table:\s*(.*?)\s*-->")
EXPLICIT_ANCHOR_RE = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}


class Errors:
    def __init__(self, root):
        self.root = root
        self.items = []

    def add(self, path, line, message):
        rel = os.path.relpath(path, self.root)
        self.items.append(f"{rel}:{line}: {message}")


# ---------------------------------------------------------------- programs


def run_help(argv):
    try:
        out = subprocess.run(argv + ["--help"], capture_output=True, text=True,
                             timeout=60)
    except OSError as e:
        sys.exit(f"check_docs: cannot run {argv[0]}: {e}")
    if out.returncode != 0:
        sys.exit(f"check_docs: {' '.join(argv)} --help exited {out.returncode}:"
                 f"\n{out.stderr}")
    return out.stdout


def parse_help(text):
    """Flags and subcommands of one CLI11 --help page."""
    flags, subcommands = set(), []
    section = None
    for line in text.splitlines():
        stripped = line.strip()
        if re.match(r"^\S.*:$", line) or re.match(r"^\s*\[Option Group:", line):
            section = stripped
            continue
        if section == "Subcommands:":
            m = HELP_SUBCOMMAND_RE.match(line)
            if m:
                subcommands.append(m.group(1))
            continue
        if section == "Positionals:":
            continue
        m = HELP_FLAG_RE.match(line)
        if m:
            flags.add(m.group(1))
    return flags, subcommands


def discover_programs(server, cli, load):
    """{program name: set of flags its --help prints}."""
    programs = {}
    for name, binary in ((SERVER, server), (LOAD, load)):
        flags, _ = parse_help(run_help([binary]))
        programs[name] = flags

    def walk(words):
        flags, subcommands = parse_help(run_help([cli] + words))
        programs[" ".join([CLI] + words)] = flags
        for sub in subcommands:
            walk(words + [sub])

    walk([])
    for name, flags in programs.items():
        if not flags - {"--help"}:
            continue
        if "--help" not in flags:
            sys.exit(f"check_docs: could not read {name} --help (no --help line)")
    return programs


# --------------------------------------------------------------- markdown


class Block:
    """Lines of one paragraph, table, heading or code line, with positions."""

    def __init__(self, kind, lines, first_line):
        self.kind = kind          # "text", "heading", "code"
        self.lines = lines
        self.first_line = first_line
        self.text = "\n".join(lines)

    def line_of(self, offset):
        return self.first_line + self.text.count("\n", 0, offset)


def parse_markdown(text):
    """Blocks of a Markdown file, and its headings as (line, level, text)."""
    blocks, headings = [], []
    lines = text.split("\n")
    para, para_start = [], 0
    fence = None
    prev_blank = True
    in_indented = False

    def flush():
        nonlocal para
        if para:
            blocks.append(Block("text", para, para_start))
            para = []

    for i, line in enumerate(lines, 1):
        if fence:
            if re.match(r"^\s{0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", line):
                fence = None
            else:
                blocks.append(Block("code", [line], i))
            continue
        m = FENCE_RE.match(line)
        if m:
            flush()
            fence = m.group(1)
            in_indented = False
            prev_blank = False
            continue
        if not line.strip():
            flush()
            prev_blank = True
            continue
        if (prev_blank or in_indented) and line.startswith("    ") and not para:
            blocks.append(Block("code", [line], i))
            in_indented = True
            prev_blank = False
            continue
        in_indented = False
        prev_blank = False
        h = HEADING_RE.match(line)
        if h:
            flush()
            headings.append((i, len(h.group(1)), h.group(2)))
            blocks.append(Block("heading", [h.group(2)], i))
            continue
        if not para:
            para_start = i
        para.append(line)
    flush()
    return blocks, headings


def heading_text(raw):
    """A heading's text as rendered: no code marks, emphasis or link targets."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").replace("*", "")
    return text.strip()


def slug(text):
    out = []
    for ch in heading_text(text).lower():
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN" or cat[0] == "M":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def anchors_of(path, cache):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        _, headings = parse_markdown(text)
        seen, anchors = {}, set()
        for _, _, raw in headings:
            base = slug(raw)
            n = seen.get(base, 0)
            anchors.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        anchors.update(EXPLICIT_ANCHOR_RE.findall(text))
        cache[path] = anchors
    return cache[path]


def without_code_spans(text):
    return CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), text)


# ------------------------------------------------------------------ links


def check_links(path, blocks, root, errors, anchor_cache):
    count = 0
    for block in blocks:
        if block.kind == "code":
            continue
        text = without_code_spans(block.text)
        text = re.sub(r"<!--.*?-->", lambda m: " " * len(m.group(0)), text, flags=re.S)
        for m in LINK_RE.finditer(text):
            target = m.group(2)
            line = block.line_of(m.start())
            if not target:
                errors.add(path, line, f"empty link target in {m.group(0)!r}")
                continue
            if SCHEME_RE.match(target) or target.startswith("//"):
                continue
            count += 1
            file_part, _, anchor = target.partition("#")
            if file_part:
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            else:
                resolved = path
            if os.path.commonpath([resolved, root]) != root:
                errors.add(path, line, f"link {target!r} leaves the repository")
                continue
            if not os.path.exists(resolved):
                errors.add(path, line, f"link {target!r}: no such file {os.path.relpath(resolved, root)}")
                continue
            if anchor and resolved.endswith(".md"):
                if anchor not in anchors_of(resolved, anchor_cache):
                    errors.add(path, line, f"link {target!r}: {os.path.relpath(resolved, root)} "
                                           f"has no heading with anchor #{anchor}")
    return count


# ------------------------------------------------------------------ flags


def flags_in(text):
    return FLAG_RE.findall(text)


def programs_named(words, programs):
    """The programs a command's leading words name, and how many words."""
    first = os.path.basename(words[0]) if words else ""
    if first in (SERVER, LOAD):
        return {first}, 1
    if first != CLI:
        return None, 0
    names, used = {CLI}, 1
    while used < len(words):
        options = words[used].split("|")
        nxt = {f"{n} {o}" for n in names for o in options}
        if not all(any(p == c for p in programs) for c in nxt):
            break
        names, used = nxt, used + 1
    return names, used


def command_segments(text):
    """Shell-ish segments of a command text, split at separators outside [...]."""
    segments, current, depth = [], [], 0
    for token in text.split():
        if token.startswith("#") and depth == 0:
            break
        if token in SEPARATORS and depth == 0:
            segments.append(current)
            current = []
            continue
        depth += token.count("[") - token.count("]")
        depth = max(depth, 0)
        ends = token.endswith(";") and depth == 0
        current.append(token.rstrip(";") if ends else token)
        if ends:
            segments.append(current)
            current = []
    segments.append(current)
    return segments


def command_programs(segment, programs):
    words = list(segment)
    while words and (words[0] == "$" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
        words.pop(0)
    names, used = programs_named(words, programs)
    if not names:
        return None, []
    return names, words[used:]


def check_flag(path, line, flag, names, programs, errors, where):
    if not any(flag in programs[n] for n in names):
        shown = ", ".join(sorted(names))
        errors.add(path, line, f"{flag} ({where}) is not a flag of {shown} (its --help does not print it)")


def context_programs(heading_stack, page_default, programs):
    for level, text in reversed(heading_stack):
        if level < 2:
            continue  # a page's title names its subject, not a section's program
        name = heading_text(text)
        if name in (SERVER, LOAD):
            return {name}
        if name == CLI or name.startswith(CLI + " "):
            named = {p for p in programs if p == name or p.startswith(name + " ")}
            if named:
                return named
    return page_default


def check_flags(path, blocks, programs, errors, page_default, tables):
    checked = 0
    heading_stack = []
    code_command = None   # programs of the last command line in a code block
    last_code_line = -2
    pending_marker = None

    for block in blocks:
        if block.kind == "heading":
            heading_stack = [h for h in heading_stack if h[0] < block.level]
            heading_stack.append((block.level, block.text))
        context = context_programs(heading_stack, page_default, programs)

        if block.kind == "code":
            stripped = block.text.strip()
            continues = block.first_line == last_code_line + 1
            last_code_line = block.first_line
            if stripped.startswith(("--", "[--")):
                # The next line of the command above (a synopsis or a line
                # continued with \), or, first in a block, flags on their own.
                if continues and code_command is None:
                    continue
                names = code_command if continues else context
                where = "command" if continues else "bare flag"
                for flag in flags_in(stripped):
                    check_flag(path, block.first_line, flag, names, programs, errors, where)
                    checked += 1
                continue
            code_command = None
            for segment in command_segments(stripped):
                names, rest = command_programs(segment, programs)
                if names is None:
                    continue
                code_command = names
                for flag in flags_in(" ".join(rest)):
                    check_flag(path, block.first_line, flag, names, programs, errors, "command")
                    checked += 1
            continue
        code_command = None

        text = block.text
        # Flag tables (a marker inside inline code is an example, not a marker).
        markers = list(MARKER_RE.finditer(without_code_spans(text)))
        for m in markers:
            names = [n.strip() for n in m.group(1).split(",") if n.strip()]
            line = block.line_of(m.start())
            unknown = [n for n in names if n not in programs]
            for n in unknown:
                errors.add(path, line, f"flag-table names {n!r}, which is not a program "
                                       f"(programs: {', '.join(sorted(programs))})")
            pending_marker = ([n for n in names if n in programs], line)
        table_lines = [(block.first_line + i, l) for i, l in enumerate(block.lines)
                       if l.lstrip().startswith("|")]
        if table_lines:
            header = [c.strip() for c in table_lines[0][1].strip().strip("|").split("|")]
            is_flag_table = header and header[0].lower().startswith("flag")
            if pending_marker is None and is_flag_table:
                errors.add(path, table_lines[0][0],
                           "a flag table without a <!-- flag-table: PROGRAM --> marker before it")
            if pending_marker is not None:
                names, marker_line = pending_marker
                seen = set()
                for line_no, row in table_lines[2:]:
                    cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
                    first = cells[0] if cells else ""
                    row_flags = flags_in(" ".join(s for _, s in CODE_SPAN_RE.findall(first)))
                    if not row_flags:
                        errors.add(path, line_no, "flag table row without a flag in its first cell")
                    for flag in row_flags:
                        if flag in seen:
                            errors.add(path, line_no, f"{flag} listed twice in one flag table")
                        seen.add(flag)
                        for n in names:
                            if flag not in programs[n]:
                                errors.add(path, line_no, f"{flag} (flag table) is not a flag of {n} "
                                                          f"(its --help does not print it)")
                            tables.setdefault(n, set()).add(flag)
                        checked += 1
                pending_marker = None
        elif not markers and pending_marker is not None and block.kind == "text":
            errors.add(path, pending_marker[1], "flag-table marker not followed by a table")
            pending_marker = None

        # Commands and bare flags in inline code.
        for m in CODE_SPAN_RE.finditer(text):
            span = m.group(2).replace("\\|", "|").strip()
            line = block.line_of(m.start())
            first = span.lstrip("[(")
            if first.startswith("--"):
                for flag in flags_in(span):
                    check_flag(path, line, flag, context, programs, errors, "bare flag")
                    checked += 1
                continue
            for segment in command_segments(span):
                names, rest = command_programs(segment, programs)
                if names is None:
                    continue
                for flag in flags_in(" ".join(rest)):
                    check_flag(path, line, flag, names, programs, errors, "command")
                    checked += 1
    if pending_marker is not None:
        errors.add(path, pending_marker[1], "flag-table marker not followed by a table")
    return checked


# ------------------------------------------------------------------- main


def markdown_files(root, subdir_too):
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    for dirpath, dirnames, filenames in os.walk(docs):
        dirnames.sort()
        if not subdir_too and dirpath != docs:
            continue
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--load", required=True)
    args = parser.parse_args()
    root = os.path.realpath(args.root)
    errors = Errors(root)
    programs = discover_programs(args.server, args.cli, args.load)

    anchor_cache = {}
    links = 0
    parsed = {}
    for path in markdown_files(root, subdir_too=True):
        with open(path, encoding="utf-8") as f:
            blocks, headings = parse_markdown(f.read())
        levels = {line: level for line, level, _ in headings}
        for b in blocks:
            b.level = levels.get(b.first_line, 0)
        parsed[path] = blocks
        links += check_links(path, blocks, root, errors, anchor_cache)

    clients = {p for p in programs if p == LOAD or p == CLI or p.startswith(CLI + " ")}
    tables = {}
    flags = 0
    for path in markdown_files(root, subdir_too=False):
        default = clients if os.path.relpath(path, root) == os.path.join("docs", "clients.md") \
            else {SERVER}
        flags += check_flags(path, parsed[path], programs, errors, default, tables)

    for name in sorted(programs):
        missing = sorted(programs[name] - {"--help"} - tables.get(name, set()))
        for flag in missing:
            errors.items.append(f"docs/: {name} --help prints {flag}, which no flag table "
                                f"(<!-- flag-table: {name} -->) lists")

    for item in errors.items:
        print(item)
    if errors.items:
        print(f"check_docs: {len(errors.items)} problem(s) in README.md and docs/")
        return 1
    print(f"check_docs: OK: {links} relative links resolve; {flags} flag mentions are flags "
          f"of their programs; every flag of {len(programs)} programs' --help is documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
