"""The screenshots of docs/view.md: each page of `coevolve view` on a warehouse, taken by the system's headless
Chromium (`make browser`) through selenium, as PNG files in docs/.

    .venv/bin/python .ci/view_screenshots.py --database .coevolve/warehouse   # after `make run`

The ids in the pages' addresses are taken from the warehouse: its last round, an episode of it that called a tool,
and a synthesized task that validation accepted.
"""

from __future__ import annotations

import argparse
import re
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage.warehouse import Warehouse  # noqa: E402

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
)  # fmt: skip


def addresses(root: Path) -> dict[str, str]:
    """Screenshot name -> page address, with ids of the warehouse at ``root``."""
    with Warehouse.for_queries(root) as wh:
        run, last = wh.sql("SELECT run_id, max(round) AS r FROM trajectories GROUP BY run_id ORDER BY r DESC").row(0)
        episode = wh.sql(
            f"SELECT trajectory_id FROM trajectories WHERE run_id = '{run}' AND round = {last} "
            "AND len(tool_sequence) > 1 ORDER BY success DESC, trajectory_id LIMIT 1"
        ).item()
        # An accepted task that later rounds played, the most played first.
        task = wh.sql(
            "SELECT c.task_id FROM candidates AS c LEFT JOIN trajectories AS t USING (run_id, task_id) "
            f"WHERE c.run_id = '{run}' AND c.accepted GROUP BY c.task_id ORDER BY count(t.task_id) DESC, c.task_id "
            "LIMIT 1"
        ).item()
    return {
        "view_index": "",
        "view_round": f"runs/{quote(run)}/rounds/{last}",
        "view_episode": f"episodes/{episode}",
        "view_task": f"tasks/{task}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", type=Path, required=True, help="The warehouse folder.")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args()
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "view", "--database", str(args.database), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)
        found = re.search(r"(http://127\.0\.0\.1:\d+/)", process.stdout.readline()) if ready else None
        if found is None:
            raise SystemExit("coevolve view did not start")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={args.width},{args.height}")
        with tempfile.TemporaryDirectory() as profile:
            options.add_argument(f"--user-data-dir={profile}")
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
            try:
                for name, page in addresses(args.database).items():
                    driver.get(found.group(1) + page)
                    path = args.out / f"{name}.png"
                    driver.save_screenshot(str(path))
                    print(f"{path}  {path.stat().st_size // 1024} KB  /{page}")
            finally:
                driver.quit()
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
