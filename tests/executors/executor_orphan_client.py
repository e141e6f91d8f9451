"""A client process for test_executor_orphans: start a one-node executor, report, then wait.

Usage: python executor_orphan_client.py RUN_DIR
"""

from __future__ import annotations

import os
import sys
import time

from malleparsl.site_configs.local import local_config

if __name__ == "__main__":
    run_dir = sys.argv[1]
    cfg = local_config(nodes=1, run_dir=run_dir, malleable=False, heartbeat_period=1,
                       heartbeat_threshold=3)
    ex = cfg.executors[0]
    ex.run_dir, ex.run_id, ex.log_config, ex.monitoring_messages = run_dir, "orphan", None, None
    ex.provider.script_dir = run_dir
    ex.start()
    ex.wait_for_nodes(1, timeout_s=180)
    print("READY", ex.interchange_proc.pid, ex.node_info("node-00")["pgid"], flush=True)
    time.sleep(600)  # the test SIGKILLs us long before this
    os._exit(1)
