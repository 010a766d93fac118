#!/usr/bin/env python3
"""Documentation link check: every relative link of README.md, data/*.md and docs/**/*.md names a
file that exists and, for a link into a Markdown file with #anchor, a heading of that file.

Anchors follow GitHub's rule: the heading's text lower-cased, every character other than a
letter, digit, '_', '-' or space dropped, spaces made '-', a repeated anchor suffixed -1, -2, ...
Headings inside fenced code blocks do not count. Prints one line per broken link and fails.
Usage: check_doc_links.py [SOURCE_ROOT]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])
heading_re = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
link_re = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path):
    seen, out, fenced = {}, set(), False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else heading_re.match(line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(2).lower()).replace(" ", "-")
        n = seen.get(base, -1) + 1
        seen[base] = n
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def strip_code(text):
    """The text without fenced blocks and inline code spans (links there are examples)."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


bad = []
cache = {}
for doc in [root / "README.md", *sorted((root / "data").glob("*.md")), *sorted((root / "docs").glob("**/*.md"))]:
    for link in link_re.findall(strip_code(doc.read_text())):
        if re.match(r"^[a-z]+:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        name = doc.relative_to(root)
        if not target.exists():
            bad.append(f"{name}: link to a missing file: {link}")
        elif anchor and target.suffix == ".md":
            if target not in cache:
                cache[target] = anchors(target)
            if anchor not in cache[target]:
                bad.append(f"{name}: link to a missing heading: {link}")
for line in bad:
    print(line)
sys.exit(1 if bad else 0)
