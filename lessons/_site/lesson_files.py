"""A lesson page's files and the ways to run it yourself (mkdocs.yml: `hooks:`).

1. Figures as files. nbconvert inlines each stored plot as a `data:` URI; the lightbox (mkdocs-glightbox,
   click to zoom) links every image to itself, which would store each plot twice in the page. Here
   each plot is written once, next to its page (`figures/<hash>.png`), and the page points to it.
   This hook runs before the lightbox's (event priority).
2. Download the notebook: each lesson's notebook is copied next to its page, and a button above the
   lesson links it. Where the repository's address is known at build time (REPO_URL, like SITE_URL:
   the GitHub Pages workflow sets both; unset locally), the copy starts with a cell that installs the
   course's library when it is not importable (a hosted notebook service), a no-op in a checkout.
3. Open in a hosted notebook: with REPO_URL, a second button opens the lesson in Colab. Colab opens
   notebooks from GitHub only (/github/OWNER/REPO/blob/BRANCH/PATH), and the repository's own notebooks
   cannot carry the install cell (their address is unknown until build time), so the Pages workflow
   publishes the copies of `write_hosted_notebooks`, install cell first, on the branch HOSTED_BRANCH
   under the lessons' own paths, and Colab opens those.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority

DATA_PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=\s]+)"')
TEXT = {
    "en": {"download": "Download the notebook", "colab": "Open in Colab",
           "download_title": "This lesson as a Jupyter notebook, to run on your machine",
           "colab_title": "Run this lesson in Google Colab, nothing to install"},
    "ru": {"download": "Скачать блокнот", "colab": "Открыть в Colab",
           "download_title": "Этот урок как блокнот Jupyter, чтобы запустить его у себя",
           "colab_title": "Запустить урок в Google Colab, ничего не устанавливая"},
}
INSTALL_CELL = (
    "# Outside a checkout of the course (a hosted notebook, say), install its library first.\n"
    "import importlib.util\n"
    "\n"
    "if importlib.util.find_spec(\"fsdp_mini\") is None:\n"
    "    %pip install --quiet \"fsdp-mini[notebooks] @ git+{repo}\""
)


HOSTED_BRANCH = "hosted-notebooks"  # where the Pages workflow publishes the notebooks Colab opens


def repository() -> str | None:
    """The course repository's address, from REPO_URL (set by the Pages workflow); None when unset."""
    url = os.environ.get("REPO_URL", "").strip().rstrip("/")
    return url.removesuffix(".git") or None


def colab_url(repo: str, path: str) -> str | None:
    """Colab's address of the published copy of the notebook at `path` (relative to the repository's
    root); None for a repository outside GitHub, which Colab cannot open."""
    found = re.match(r"^https?://github\.com/([^/]+)/([^/]+)$", repo)
    if not found:
        return None
    return f"https://colab.research.google.com/github/{found[1]}/{found[2]}/blob/{HOSTED_BRANCH}/{path}"


def notebook_copy(source: Path, repo: str | None) -> str:
    """The notebook a reader downloads: the lesson as it is, with an install cell first when the
    repository is known."""
    text = source.read_text(encoding="utf-8")
    if not repo:
        return text
    nb = json.loads(text)
    cell = {"cell_type": "code", "execution_count": None, "id": "install-fsdp-mini",
            "metadata": {"tags": ["install"]}, "outputs": [],
            "source": INSTALL_CELL.format(repo=repo).splitlines(keepends=True)}
    nb["cells"].insert(0, cell)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def write_hosted_notebooks(root: Path, out: Path, repo: str) -> list[Path]:
    """Copy every lesson notebook under `root`/lessons to the same path under `out`, install cell first:
    the tree the Pages workflow pushes to HOSTED_BRANCH. Returns the files written."""
    written = []
    for source in sorted((root / "lessons").glob("*/*.ipynb")):
        target = out / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(notebook_copy(source, repo), encoding="utf-8")
        written.append(target)
    return written


def _language(page) -> str:
    parts = page.file.src_uri.split("/")
    return parts[0] if len(parts) > 1 and parts[0] in TEXT else "en"


def _page_dir(page, config) -> Path:
    return Path(config.site_dir) / posixpath.dirname(page.file.dest_uri)


def _figures_to_files(html: str, page, config) -> str:
    folder = _page_dir(page, config) / "figures"

    def to_file(m: re.Match) -> str:
        data = base64.b64decode(m.group(1))
        name = hashlib.sha256(data).hexdigest()[:16] + ".png"
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / name).is_file():
            (folder / name).write_bytes(data)
        return f'src="figures/{name}"'

    return DATA_PNG.sub(to_file, html)


def _run_buttons(page, config) -> str:
    text, source = TEXT[_language(page)], Path(page.file.abs_src_path)
    repo = repository()
    target = _page_dir(page, config) / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(notebook_copy(source, repo), encoding="utf-8")
    buttons = [f'<a class="md-button lesson-download" href="./{source.name}" download title="{text["download_title"]}">'
               f'{text["download"]}</a>']
    if repo:
        path = Path(page.file.abs_src_path).resolve().relative_to(Path(config.config_file_path).resolve().parent)
        colab = colab_url(repo, path.as_posix())
        if colab:
            buttons.append(f'<a class="md-button lesson-colab" href="{colab}" title="{text["colab_title"]}">'
                           f'{text["colab"]}</a>')
    return '<p class="lesson-run">' + " ".join(buttons) + "</p>"


@event_priority(50)  # before mkdocs-glightbox wraps the images
def on_page_content(html: str, page, config, files) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = _figures_to_files(html, page, config)
    buttons = _run_buttons(page, config)
    heading = html.find("</h1>")
    if heading < 0:
        return buttons + html
    heading += len("</h1>")
    return html[:heading] + buttons + html[heading:]
