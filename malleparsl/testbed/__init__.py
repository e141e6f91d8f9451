"""Test beds: emulated facility hosts on one machine, for tests and benchmarks.

Not imported by the executor: these build the environment a run happens in (network namespaces
as hosts, a provider that starts each node's pilot on its host).
"""

from malleparsl.testbed.netns import Host, NetnsTestbed, TestbedError, remove_stale

__all__ = ["Host", "NetnsTestbed", "TestbedError", "remove_stale"]
