"""Globus Compute endpoint config: malleable training with malleparsl on aurora.

Copy to ``~/.globus_compute/<endpoint-name>/config.py`` after
``globus-compute-endpoint configure <endpoint-name>`` (a config.py there takes precedence over
config.yaml), replace the YOUR_* placeholders, then ``globus-compute-endpoint start
<endpoint-name>``. See docs/globus.md.
"""

from globus_compute_endpoint.endpoint.config import UserEndpointConfig

from malleparsl.executors.globus_engine import MalleableEngine
from malleparsl.site_configs.aurora import aurora_config

# The site config's executor (nodes, scavenger, policy) becomes the engine's executor.
# Aurora documents no preemptable queue (as far as we know): name the queue you may use, and
# add allow_nonpreemptible=True if it is not preemptible (pilots then are ordinary jobs).
executor = aurora_config(account="YOUR_PROJECT", queue="preemptable").executors[0]

config = UserEndpointConfig(
    display_name="malleparsl on aurora",
    engine=MalleableEngine(executor=executor),
)
