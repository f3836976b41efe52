"""A script that sets MASTER_ADDR/MASTER_PORT itself still joins torchrun's rendezvous.

Scripts written for their own `mp.spawn` launch set `os.environ["MASTER_PORT"] = "12345"`; once
migrated and started by torchrun / `accel launch`, that port is one nobody serves (the agent's store
listens on the launcher's port), and the processes would wait for each other forever. The runtime
uses the launcher's values read at import, with a warning on the main process.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.runtime.rt_helpers import torchrun

SCRIPT = textwrap.dedent('''
    import json, os, sys, warnings
    import torch
    from runtime import Accelerator

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "1"  # nobody serves it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(cpu=True)
    said = [str(w.message) for w in caught if "the launcher serves the rendezvous" in str(w.message)]
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), reduction="sum")
    out = {"world": accelerator.num_processes, "total": total.item(), "port": os.environ["MASTER_PORT"],
           "warned": len(said)}
    with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(out, f)
''')


def test_script_set_rendezvous_is_overridden_by_the_launchers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = torchrun(script, str(tmp_path), cwd=Path(__file__).resolve().parents[2], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["total"] for r in ranks] == [3.0, 3.0]
    assert all(r["port"] != "1" for r in ranks)  # the launcher's port is back in the environment
    assert [r["warned"] for r in ranks] == [1, 0]  # warned once, by the main process
