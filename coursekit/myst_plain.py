"""MyST markup as plain Markdown and HTML, for readers that are not the book.

Jupyter, Colab and VS Code (and nbconvert, which makes the feedback pages) render CommonMark
and HTML, not MyST. ``render`` turns the MyST a chapter's prose uses into what they show:

* a ``dropdown`` directive (hints, answers) becomes ``<details><summary>…</summary>…</details>``,
  collapsed as the book collapses it;
* an admonition (``admonition``, ``note``, ``warning``, ...) becomes a block quote headed by its
  title in bold or, for a page with its own style sheet (``boxes=True``), an HTML box;
* any other directive keeps its body, without the markup;
* a glue role (``{glue:text}`name:fmt```) becomes the glued name as code: the notebook has no
  outputs, so its number is the one the learner's own run prints (``glue`` prints ``name = value``);
* any other role keeps its text (``{math}`` as ``$…$``, a ``Title <target>`` reference as Title).

Directive blocks may be indented (an answer inside a numbered list) and may nest; fenced code
blocks are left alone. ``MYST`` finds what is left: a test fails on any learner notebook it matches.
"""
from __future__ import annotations

import html
import re

ADMONITIONS = ("note", "warning", "tip", "hint", "important", "caution", "attention", "danger", "error",
               "seealso")
# ```{name} argument   or   :::{name} argument   (the same fence, at the same indentation, closes it)
OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[A-Za-z][\w-]*)\}[ \t]*(?P<arg>.*)$")
CODE_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
OPTION = re.compile(r"^[ \t]*:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
ROLE = re.compile(r"\{(?P<role>[A-Za-z][\w:-]*)\}`(?P<text>[^`]*)`")
TARGET = re.compile(r"^(?P<title>.*?)\s*<[^<>]+>$")
# What a plain renderer would show as MyST markup: a role, a directive's fence, a bare ::: line.
MYST = re.compile(r"\{[A-Za-z][\w:-]*\}`|^[ \t]*(`{3,}|:{3,})\{[A-Za-z]|^[ \t]*:{3,}[ \t]*$", re.M)


def render(markdown: str, boxes: bool = False) -> str:
    """MARKDOWN with its MyST directives and roles as plain Markdown and HTML (see the module)."""
    return "\n".join(_lines(markdown.split("\n"), boxes))


def glue_names(markdown: str) -> list[str]:
    """The names MARKDOWN's glue roles quote, in order, once each."""
    names = [_glued(m["text"]) for m in ROLE.finditer(markdown) if m["role"].split(":")[0] == "glue"]
    return list(dict.fromkeys(names))


def _glued(text: str) -> str:
    return text.split(":", 1)[0].strip()


def _lines(lines: list[str], boxes: bool) -> list[str]:
    out, i, code_fence = [], 0, None
    while i < len(lines):
        line = lines[i]
        if code_fence is not None:  # inside a plain fenced code block: as written
            out.append(line)
            if line.strip().startswith(code_fence) and not line.strip().strip(code_fence[0]):
                code_fence = None
            i += 1
            continue
        opening = OPENING.match(line)
        if opening is None:
            fence = CODE_FENCE.match(line)
            if fence:
                code_fence = fence.group(1)
                out.append(line)
            else:
                out.append(_roles(line))
            i += 1
            continue
        end = _closing(lines, i + 1, opening["indent"], opening["fence"])
        body = lines[i + 1:end]
        out += _directive(opening, body, boxes)
        i = end + 1
    return out


def _closing(lines: list[str], start: int, indent: str, fence: str) -> int:
    """The index of the line that closes the directive opened at START - 1 (or the end)."""
    depth = 0
    for j in range(start, len(lines)):
        inner = OPENING.match(lines[j])
        if inner and inner["fence"] == fence:
            depth += 1
        elif lines[j].strip() == fence and len(lines[j]) - len(lines[j].lstrip()) <= len(indent) + 3:
            if depth == 0:
                return j
            depth -= 1
    return len(lines)


def _directive(opening: re.Match, body: list[str], boxes: bool) -> list[str]:
    indent, name, arg = opening["indent"], opening["name"].lower(), opening["arg"].strip()
    options = {}
    while body and OPTION.match(body[0]):
        option = OPTION.match(body.pop(0))
        options[option["key"]] = option["value"].strip()
    inner = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in body]
    inner = _lines(inner, boxes)  # directives may nest
    while inner and not inner[0].strip():
        inner.pop(0)
    while inner and not inner[-1].strip():
        inner.pop()
    if name == "dropdown":
        # A blank line ends each HTML block, so the body between them is read as Markdown.
        block = [f"<details><summary>{_inline_html(arg or 'Details')}</summary>", "", *inner, "", "</details>"]
    elif name in ADMONITIONS or name == "admonition":
        title = arg if name == "admonition" else ("See also" if name == "seealso" else name.capitalize())
        if boxes:
            classes = " ".join(["admonition", name, *options.get("class", "").split()])
            block = [f'<div class="{html.escape(classes)}">', f'<p class="admonition-title">{_inline_html(title)}</p>',
                     "", *inner, "", "</div>"]
        else:
            block = [f"> **{_roles(title)}**", ">", *[f"> {line}".rstrip() for line in inner]]
    else:  # e.g. a figure or an epigraph: its content, without the markup
        block = inner
    return [f"{indent}{line}" if line else "" for line in block]


def _inline_html(text: str) -> str:
    """TEXT (one line of Markdown) as HTML for a tag whose content is not read as Markdown."""
    parts = re.split(r"(`[^`]*`)", _roles(text))
    return "".join(f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else html.escape(p, quote=False) for p in parts)


def _roles(line: str) -> str:
    return ROLE.sub(_role, line)


def _role(match: re.Match) -> str:
    role, text = match["role"].lower(), match["text"]
    if role.split(":")[0] == "glue":
        return f"`{_glued(text)}`"
    if role == "math":
        return f"${text}$"
    target = TARGET.match(text)
    return target["title"] if target and target["title"] else text
