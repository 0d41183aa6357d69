"""MediaWiki XML exports (Wikipedia's pages-articles dumps): the stream cut into <page>
elements (`split_pages`), and a page's wikitext made prose paragraphs (`page_paragraphs`:
mwxml reads the page, its last revision's wikitext is stripped with regular expressions and
mwparserfromhell). Talk, user, template, ... pages, redirects and disambiguation pages are
dropped; templates, tables, references, files and images, categories, interlanguage links,
comments, math, galleries, headings, lists and the See also / References / External links /
... sections go; link labels and the text of bold, italic and HTML tags stay."""

from __future__ import annotations

import io
import re
from typing import Iterator

from data_prep.corpus.types import Cleaned, RawDoc, bad_input, short_error

# A page bigger than this (a history dump's page with all its revisions) is skipped, named:
# the reader holds one page at a time.
MAX_PAGE_BYTES = 256 << 20

_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")


def _page_where(data: bytes) -> str:
    head = data[:data.find(b"<revision")] if b"<revision" in data else data[:4096]
    m = _PAGE_ID.search(head)
    return f"page {int(m.group(1))}" if m else "a page without an id"


# A <page> or </page> tag wherever it stands: exports put `</revision></page>` on one line,
# or a whole page on one line. Inside a page's text `<` is always escaped (`&lt;`), so these
# bytes can only be the tags themselves.
_PAGE_TAG = re.compile(rb"<(/?)page(?:\s[^<>]*)?>")
# Bytes asked of the stream at a time.
READ_BYTES = 1 << 20


def split_pages(stream, path: str) -> Iterator[RawDoc]:
    """<page> elements as bytes, cut at their tags (read in chunks, whatever the line
    layout), so one malformed page is skipped alone. A file that ends inside a page gives
    "bad" for that page only."""
    buf: list[bytes] = []
    size, in_page, pages, too_big = 0, False, 0, False

    def add(data: bytes):
        nonlocal buf, size, too_big
        if not in_page or too_big or not data:
            return None
        size += len(data)
        if size > MAX_PAGE_BYTES:
            where = _page_where(b"".join(buf))
            buf, too_big = [], True
            return RawDoc("bad", f"larger than {MAX_PAGE_BYTES >> 20} MB, skipped", path, where)
        buf.append(data)
        return None

    # read1: what one read of the file gives, so that a compressed file cut short still
    # hands over every page decompressed before the cut.
    read, pending = getattr(stream, "read1", stream.read), b""
    while True:
        chunk = read(READ_BYTES)
        data, eof = pending + chunk, not chunk
        pos = 0
        for m in _PAGE_TAG.finditer(data):
            if (bad := add(data[pos:m.start()])) is not None:
                yield bad
            pos = m.end()
            if not m.group(1):  # <page>
                if in_page and not too_big:  # no </page>: the parser names what came before
                    yield RawDoc("wiki", b"".join(buf), path, _page_where(b"".join(buf)))
                buf, size, in_page, too_big = [], 0, True, False
                pages += 1
                if (bad := add(m.group(0))) is not None:
                    yield bad
            elif in_page:  # </page>
                if (bad := add(m.group(0))) is None and not too_big:
                    page = b"".join(buf)
                    yield RawDoc("wiki", page, path, _page_where(page))
                elif bad is not None:
                    yield bad
                buf, size, in_page, too_big = [], 0, False, False
        rest = data[pos:]
        # A tag cut by the chunk's end waits for the next chunk.
        cut = rest.rfind(b"<")
        pending = (b"" if eof or cut < 0 or b">" in rest[cut:] or len(rest) - cut > 256
                   else rest[cut:])
        if pending:
            rest = rest[:cut]
        if (bad := add(rest)) is not None:
            yield bad
        if eof:
            break
    if in_page and not too_big:
        yield RawDoc("bad", "the file ends inside this page (truncated); the pages before "
                     "it were read", path, _page_where(b"".join(buf)))
    elif not pages:
        yield RawDoc("bad", "no <page> element: not a MediaWiki XML export", path, "")


def page_paragraphs(raw: RawDoc) -> list[str] | Cleaned:
    """A "wiki" RawDoc (one <page> element) -> the prose paragraphs of its article, or why
    it is dropped (non-article, redirect, disambiguation, bad input)."""
    page = parse_page(raw)
    if isinstance(page, Cleaned):
        return page
    namespace, redirect, title, text = page
    if namespace != 0:
        return Cleaned(None, "non-article")
    if redirect or text.lstrip()[:9].lower() == "#redirect":
        return Cleaned(None, "redirect")
    text, templates = prestrip(text)
    if is_disambiguation(templates, title):
        return Cleaned(None, "disambiguation")
    import mwparserfromhell
    return wiki_paragraphs(mwparserfromhell.parse(text))


def parse_page(raw: RawDoc):
    """(namespace, redirect target, title, text of the last revision), or bad input."""
    from mwxml.element_iterator import ElementIterator
    from mwxml.iteration.page import Page

    try:
        page = Page.from_element(ElementIterator.from_file(io.BytesIO(raw.data)))
        text = None
        for revision in page:
            text = revision.text
        namespace, redirect, title = page.namespace, page.redirect, page.title or ""
    except Exception as e:  # noqa: BLE001  (expat's, mwxml's and int()'s errors alike)
        return bad_input(raw, f"malformed XML ({short_error(e)})")
    return namespace, redirect, title, text or ""


# Templates that mark a disambiguation page ({{disambiguation}}, {{dab}}, {{hndis}},
# {{geodis}}, {{hospital disambiguation}}, ...; not {{disambiguation needed}}).
_DAB_TEMPLATES = {"disambiguation", "disambig", "disamb", "dab", "dis", "hndis", "geodis",
                  "numberdis", "mil-unit-dis", "shipindex", "letter-numbercombdisambig"}
# Sections of references and links, not prose.
_SKIP_SECTIONS = {"see also", "references", "external links", "further reading", "notes",
                  "bibliography", "sources", "citations", "footnotes", "notes and references",
                  "works cited", "references and notes", "external links and references"}
_DROP_TAGS = {"ref", "references", "table", "tr", "td", "th", "caption", "gallery", "math",
              "chem", "ce", "timeline", "score", "imagemap", "syntaxhighlight", "source", "pre",
              "code", "graph", "mapframe", "maplink", "templatedata", "templatestyles", "hiero",
              "inputbox", "categorytree", "includeonly", "noinclude", "hr", "indicator"}
_DROP_LINKS = {"file", "image", "category", "media"}
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(-[a-z]+)*")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_EMPTY_BRACKETS = re.compile(r"\s*\(\s*[,;]?\s*\)")
_TABLE_LINE = ("{|", "|", "!")


def _template_name(template) -> str:
    return " ".join(str(template.name).replace("_", " ").split()).lower()


def is_disambiguation(templates: list[str], title: str) -> bool:
    if title.endswith("(disambiguation)"):
        return True
    for name in templates:
        name = " ".join(name.replace("_", " ").split()).lower()
        if name in _DAB_TEMPLATES or name.endswith(" disambiguation"):
            return True
    return False


# What prestrip removes whole before parsing: comments, and the elements whose content is
# never prose (references, math, galleries, code, ...), paired or self-closing.
_DROP_ELEMENTS = re.compile(
    r"<!--.*?(?:-->|\Z)"
    r"|<(ref|references|math|chem|ce|gallery|timeline|score|imagemap|syntaxhighlight|source"
    r"|pre|graph|mapframe|templatedata|templatestyles|hiero|inputbox|categorytree|includeonly"
    r"|noinclude|indicator)\b[^>]*?(?:/>|>.*?</\1\s*>)",
    re.IGNORECASE | re.DOTALL)
_BRACES = re.compile(r"\{\{|\}\}|^[ \t]*\{\||^[ \t]*\|\}", re.MULTILINE)


def prestrip(text: str) -> tuple[str, list[str]]:
    """Wikitext without comments, references and the like, templates and tables, and the
    names of its outermost templates. Done with regular expressions and brace matching
    before mwparserfromhell parses the rest: building its node tree for templates and
    references, most of an article's markup, is what makes parsing slow."""
    text = _DROP_ELEMENTS.sub("", text)
    out, names, stack, pos, start = [], [], [], 0, 0
    for m in _BRACES.finditer(text):
        token = m.group().strip()
        if token in ("{{", "{|"):
            if not stack:
                start = m.start()
                if token == "{{":
                    names.append(re.split(r"[|}\n]", text[m.end():m.end() + 200], 1)[0])
            stack.append(token)
        elif stack and stack[-1] == ("{{" if token == "}}" else "{|"):
            stack.pop()
            if not stack:
                out.append(text[pos:start])
                pos = m.end()
    # An unclosed template or table stays as text (mwparserfromhell reads it as such).
    out.append(text[pos:])
    return "".join(out), names


class _Walk:
    def __init__(self):
        self.out: list[str] = []
        self.skip_line = False      # inside a list item
        self.skip_level = 0         # inside a skipped section of this heading level


def wiki_paragraphs(code) -> list[str]:
    """The prose of parsed wikitext, a paragraph per item (BERT's Wikipedia: text
    passages only, no lists, tables or headings)."""
    walk = _Walk()
    _walk(code.nodes, walk)
    text = _MAGIC_WORD.sub("", "".join(walk.out))
    paragraphs = []
    for line in text.split("\n"):
        line = " ".join(line.split())
        if line and not line.startswith(_TABLE_LINE):
            paragraphs.append(_EMPTY_BRACKETS.sub("", line))
    return paragraphs


def _walk(nodes, w: _Walk) -> None:
    from mwparserfromhell import nodes as n

    for node in nodes:
        if isinstance(node, n.Heading):
            level = node.level
            if w.skip_level and level > w.skip_level:
                continue
            title = " ".join(node.title.strip_code().split()).lower()
            w.skip_level = level if title in _SKIP_SECTIONS else 0
            w.skip_line = False
            w.out.append("\n")
            continue
        if w.skip_level:
            continue
        if isinstance(node, n.Text):
            s = node.value
            if w.skip_line:
                cut = s.find("\n")
                if cut < 0:
                    continue
                w.skip_line, s = False, s[cut:]
            w.out.append(s)
        elif w.skip_line:
            continue
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if node.wiki_markup and tag in ("li", "dt", "dd"):
                w.skip_line = True
            elif tag == "br":
                w.out.append("\n")
            elif tag not in _DROP_TAGS and node.contents is not None:
                _walk(node.contents.nodes, w)
        elif isinstance(node, n.Wikilink):
            title = str(node.title).strip()
            prefix = title.split(":", 1)[0].strip().lower() if ":" in title else ""
            if prefix in _DROP_LINKS or (node.text is None and _LANGUAGE_PREFIX.fullmatch(prefix)):
                continue
            if node.text is not None:
                _walk(node.text.nodes, w)
            else:
                w.out.append(title.lstrip(":"))
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _walk(node.title.nodes, w)
        elif isinstance(node, n.HTMLEntity):
            w.out.append(node.normalize())
        # Templates, template arguments and comments are dropped.
