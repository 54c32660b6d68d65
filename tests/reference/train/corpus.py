"""The English text the reference models learn from: the Python 3.11 documentation of Debian.

Source: the Debian 12 package python3.11-doc (3.11.2-6+deb12u9, sha256 in PACKAGE_SHA256),
the reStructuredText sources it ships under usr/share/doc/python3.11/html/_sources/. The
Python documentation is licensed under the PSF License Agreement (PSF-2.0); its code
examples are also under the Zero-Clause BSD licence (library/license.rst in the package).

Preprocessing (`clean`), the same for every file, deterministic, no randomness:

1. Files: every `*.rst.txt` under _sources/, in sorted path order, except
   whatsnew/changelog.rst.txt (a generated list of issue numbers). One file is one document.
2. Markup that carries no prose is dropped with its indented body: comments (`.. text`),
   link targets (`.. _name:`), and the directives in DROP_BLOCK (index, toctree, highlight,
   module, testsetup, ...). Directive option lines (`   :maxdepth: 2`) are dropped.
3. Object directives (`.. function:: print(*objects)`, method, class, c:function, ...) become
   their signature line; admonitions become a word: `.. note::` -> `Note:`,
   `.. versionadded:: 3.2` -> `New in version 3.2.`, `.. deprecated:: 3.6` ->
   `Deprecated since version 3.6.`; other directives keep their argument text only.
4. Section over/underlines (a line of one repeated punctuation character) are dropped.
5. Inline markup: `:role:`text <target>`` -> text, `:role:`~a.b.c`` -> c, `:role:`x`` -> x,
   ``x`` -> x, `text <url>`_ -> text, `x`_ -> x, |version| and |release| -> 3.11.
6. A paragraph ending in `::` ends in `:`; a lone `::` line goes.
7. Trailing spaces are stripped, runs of blank lines become one, tabs become 8 spaces, the
   text is NFC-normalised and ends with one newline. Empty documents are dropped.

The held-out split is by document: a document is held out when the first 8 hex digits of
sha256(its relative path) are 0 modulo 20 (about 5% of the text).
"""

import hashlib
import re
import subprocess
import unicodedata
from pathlib import Path

PACKAGE = "python3.11-doc"
PACKAGE_VERSION = "3.11.2-6+deb12u9"
PACKAGE_SHA256 = "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be"
LICENSE = "PSF-2.0 (Python documentation; code examples also 0BSD)"
SOURCES = "usr/share/doc/python3.11/html/_sources"
EXCLUDE = {"whatsnew/changelog.rst.txt"}

DROP_BLOCK = {
    "index", "toctree", "highlight", "module", "currentmodule", "moduleauthor", "sectionauthor",
    "testsetup", "testcleanup", "tabularcolumns", "include", "literalinclude", "image", "figure",
    "raw", "only", "contents", "program", "audit-event", "c:namespace", "c:namespace-push",
    "c:namespace-pop", "default-role", "role", "productionlist", "availability", "impl-detail",
}
OBJECTS = {
    "function", "method", "class", "attribute", "data", "exception", "decorator", "classmethod",
    "staticmethod", "abstractmethod", "coroutinemethod", "coroutinefunction", "describe",
    "object", "opcode", "cmdoption", "option", "envvar", "pdbcommand", "decoratormethod",
    "c:function", "c:member", "c:type", "c:var", "c:macro", "c:struct", "c:data", "c:enum",
    "c:enumerator", "c:union",
}
ADMONITIONS = {
    "note": "Note:", "warning": "Warning:", "seealso": "See also:", "important": "Important:",
    "caution": "Caution:", "tip": "Tip:", "hint": "Hint:", "attention": "Attention:",
    "danger": "Danger:", "error": "Error:", "topic": "", "sidebar": "", "rubric": "",
}
VERSIONED = {
    "versionadded": "New in version {}.", "versionchanged": "Changed in version {}.",
    "deprecated": "Deprecated since version {}.",
    "deprecated-removed": "Deprecated since version {}, will be removed in version {}.",
}

DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([A-Za-z0-9:_-]+)::\s*(.*)$")
COMMENT = re.compile(r"^(\s*)\.\.(\s.*)?$")
UNDERLINE = re.compile(r"^\s*([=\-~*^\"'#+`:.])\1{2,}\s*$")
OPTION = re.compile(r"^\s+:[A-Za-z0-9 _-]+:(\s.*)?$")
ROLE = re.compile(r":(?:[A-Za-z]+:)?[A-Za-z-]+:`([^`]*)`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>`]*>`__?")
REFNAME = re.compile(r"`([^`]+)`__?")


def _role_text(m):
    text = m.group(1)
    target = re.match(r"^(.*?)\s*<[^>]*>$", text, re.S)
    if target and target.group(1):
        return target.group(1)
    if text.startswith("~"):
        return text[1:].rsplit(".", 1)[-1]
    return text.lstrip("!~")


def _inline(line):
    line = ROLE.sub(_role_text, line)
    line = LINK.sub(r"\1", line)
    line = line.replace("``", "")
    line = REFNAME.sub(r"\1", line)
    return line.replace("|version|", "3.11").replace("|release|", "3.11")


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def clean(text):
    """reST source -> plain text, by the rules in the module docstring."""
    lines = text.expandtabs(8).split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        d = DIRECTIVE.match(line)
        c = None if d else COMMENT.match(line)
        if d or c:
            ind = len((d or c).group(1))
            name = d.group(2) if d else None
            arg = d.group(3).strip() if d else ""
            i += 1
            # The block: indented lines (and blank lines between them) after the marker.
            body_start = i
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > ind):
                i += 1
            body = lines[body_start:i]
            while body and not body[-1].strip():
                body.pop()
            if d is None or name in DROP_BLOCK or name.startswith("_"):
                continue
            body = [b for b in body if not OPTION.match(b)]
            if name in OBJECTS:
                head = arg
            elif name in VERSIONED:
                parts = arg.split(None, 1)
                vers = [v.rstrip(",") for v in parts[0].split(",")] if parts else [""]
                if name == "deprecated-removed":
                    head = VERSIONED[name].format(vers[0], vers[1] if len(vers) > 1 else "?")
                else:
                    head = VERSIONED[name].format(vers[0])
                if len(parts) > 1:
                    head += " " + parts[1]
            elif name in ADMONITIONS:
                head = (ADMONITIONS[name] + " " + arg).strip()
            else:
                head = arg
            if head:
                out.append(" " * ind + _inline(head))
            out.extend(body)
            out.append("")
            continue
        if UNDERLINE.match(line) and line.strip():
            i += 1
            continue
        s = line.rstrip()
        if s.strip() == "::":
            i += 1
            continue
        if s.endswith("::"):
            s = s[:-1]
        out.append(_inline(s))
        i += 1
    # Inline markup can leave trailing spaces; blank runs collapse to one blank line.
    text = "\n".join(l.rstrip() for l in out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return unicodedata.normalize("NFC", text) + "\n" if text else ""


def held_out(rel):
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 20 == 0


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract(deb, work):
    """Unpacks the .deb (checked against PACKAGE_SHA256) and returns the _sources folder."""
    got = sha256_file(deb)
    if got != PACKAGE_SHA256:
        raise RuntimeError(f"{deb}: sha256 {got}, want {PACKAGE_SHA256} ({PACKAGE} "
                           f"{PACKAGE_VERSION}); another version gives other text")
    dest = Path(work) / "deb"
    if not (dest / SOURCES).is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest / SOURCES


def download(work):
    """`apt-get download` of the pinned version into work/ (needs Debian 12's archive)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    name = f"{PACKAGE}_{PACKAGE_VERSION.replace(':', '%3a')}_all.deb"
    if not (work / name).exists():
        subprocess.run(["apt-get", "download", f"{PACKAGE}={PACKAGE_VERSION}"], cwd=work,
                       check=True)
    return work / name


def documents(src):
    """[(relative path, cleaned text)] in sorted path order, empty documents dropped."""
    docs = []
    for p in sorted(Path(src).rglob("*.rst.txt")):
        rel = p.relative_to(src).as_posix()
        if rel in EXCLUDE:
            continue
        text = clean(p.read_text(encoding="utf-8"))
        if text:
            docs.append((rel, text))
    return docs
