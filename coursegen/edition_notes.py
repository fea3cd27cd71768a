"""Notes only one edition's readers need, appended to a markdown cell of a chapter.

A note is not a translation of anything in the English source (readers in China reach
the Hugging Face hub and PyPI through mirrors, for instance), so it has no catalog entry.
Each note names the English markdown cell it follows by a phrase of it (``anchor``);
generation fails when the anchor no longer matches exactly one markdown cell, so a note
never silently drifts away. Notes are prose only: a host name or a command appears in
them as text for the reader, never in code the notebook runs.
"""
from __future__ import annotations

NOTES: dict[str, dict[str, list[tuple[str, str]]]] = {
    "zh_CN": {
        "07_gpt": [(
            "the real\n124M-parameter checkpoint (about 500 MB) and its tokenizer",
            ":::{admonition} 在中国大陆下载 GPT-2 和安装依赖\n:class: tip\n"
            "Hugging Face 的站点在一些网络中无法直接访问。`transformers` 会读取环境变量 "
            "`HF_ENDPOINT`：把它设为你能访问的 Hugging Face 镜像站的地址，再启动 Jupyter，"
            "下面的单元格就会从镜像下载检查点，例如在终端里先运行 "
            "`export HF_ENDPOINT=https://<镜像站地址>`（Windows 上用 `set`）。下载过一次以后，"
            "检查点就缓存在本机，之后不再需要网络。\n"
            "\n"
            "安装 `transformers` 等依赖包时，同样可以让 pip 使用国内的 PyPI 镜像：\n"
            "`pip install -i https://<PyPI 镜像地址>/simple -r requirements.txt`，"
            "或者用 `pip config set global.index-url https://<PyPI 镜像地址>/simple` 设为默认。"
            "镜像地址请以镜像站自己公布的为准。\n"
            ":::",
        )],
    },
}


class EditionNoteError(ValueError):
    """A note's anchor no longer matches exactly one markdown cell."""


def note_for(chapter, language: str) -> dict[int, str]:
    """Index of a markdown cell in CHAPTER -> the note that follows it in LANGUAGE's edition."""
    found = {}
    for anchor, note in NOTES.get(language, {}).get(chapter.name, []):
        hits = [i for i, cell in enumerate(chapter.cells) if cell.kind == "markdown" and anchor in cell.source]
        if len(hits) != 1:
            raise EditionNoteError(f"{chapter.name}: the {language} note anchored at {anchor[:40]!r} matches "
                                   f"{len(hits)} markdown cells, not one (coursegen/edition_notes.py)")
        found[hits[0]] = note
    return found
