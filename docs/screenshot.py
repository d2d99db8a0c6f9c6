"""Take docs/dashboard.png: the dashboard's "Decode kernels" tab in JupyterLab, in Chromium.

    pip install playwright            # the Python package only: it drives the system's Chromium
    apt-get install chromium          # Debian's; Playwright downloads no browser here
    python docs/screenshot.py [--out docs/dashboard.png] [--chromium /usr/bin/chromium]

It starts JupyterLab on a free port in a temporary folder (the simulated backend, this checkout
first on the kernel's path), runs `kvlab.dashboard()` in a new notebook, opens the tab, saves a
picture of the cell's output and prints the browser console's errors (there should be none).
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--tab", default="Decode kernels")
    args = parser.parse_args()
    folder, port, token = Path(tempfile.mkdtemp()), free_port(), "kvlab-screenshot"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import kvlab\nkvlab.dashboard()")]
    nbformat.write(notebook, folder / "dashboard.ipynb")
    env = {**os.environ, "KVLAB_BACKEND": "sim",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--allow-root",
         f"--ServerApp.token={token}", f"--notebook-dir={folder}",
         f"--LabApp.workspaces_dir={folder / 'workspaces'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            for _ in range(60):  # the server takes a few seconds to start
                try:
                    page.goto(f"http://127.0.0.1:{port}/lab/tree/dashboard.ipynb?token={token}")
                    break
                except Exception:
                    time.sleep(1)
            page.wait_for_selector(".jp-Notebook .jp-Cell >> visible=true", timeout=60_000)
            time.sleep(3)
            while page.locator(".jp-Dialog").count():  # a kernel choice or news dialog
                page.locator(".jp-Dialog .jp-mod-accept").first.click()
                time.sleep(1)
            page.locator(".jp-Cell .jp-InputArea-editor >> visible=true").first.click()
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector("text=backend:", timeout=120_000)
            page.click(f"text={args.tab}")
            time.sleep(5)  # Plotly draws
            page.locator(".jp-OutputArea-output").first.screenshot(path=args.out)
            browser.close()
        print(f"wrote {args.out}; browser console errors: {errors}")
    finally:
        lab.terminate()


if __name__ == "__main__":
    main()
