"""Globus Compute endpoint config: malleable training with malleparsl on perlmutter.

Copy to ``~/.globus_compute/<endpoint-name>/config.py`` after
``globus-compute-endpoint configure <endpoint-name>`` (a config.py there takes precedence over
config.yaml), replace the YOUR_* placeholders, then ``globus-compute-endpoint start
<endpoint-name>``. See docs/globus.md.
"""

from globus_compute_endpoint.endpoint.config import UserEndpointConfig

from malleparsl.executors.globus_engine import MalleableEngine
from malleparsl.site_configs.perlmutter import perlmutter_config

# The site config's executor (nodes, scavenger, policy) becomes the engine's executor.
executor = perlmutter_config(account="YOUR_PROJECT_g", node_cap=16).executors[0]

config = UserEndpointConfig(
    display_name="malleparsl on perlmutter",
    engine=MalleableEngine(executor=executor),
)
