"""How often FSDP2 is the chosen plan, and the only plan that fits, on the plan tests' profile
(10 M parameters, 500 k a unit, the prior performance model) over budgets 90-390 MiB in 10 MiB
steps, global batches 48, 64, 96, 128 and 1-8 nodes. Prints: cases where some plan fits, FSDP2
chosen, FSDP2 the only plan that fits (docs/plans.md quotes it)."""

from malleparsl.jpa.plans import PlanPerfModel, best_feasible
from malleparsl.plans import MemoryProfile, PlanOptions

MIB = 2**20
PROF = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                     unit_params=500_000)
NO_FSDP = ("dp", "accum", "ckpt", "zero1", "zero1+ckpt")


def main() -> None:
    perf = PlanPerfModel.default(PROF)
    fits = chosen = only = 0
    for budget in range(90, 391, 10):
        for gb in (48, 64, 96, 128):
            for n in range(1, 9):
                got = best_feasible(perf, PlanOptions(PROF, gb, budget * MIB), n)
                if got is None:
                    continue
                fits += 1
                if got[0].fsdp:
                    chosen += 1
                    rest = PlanOptions(PROF, gb, budget * MIB, bases=NO_FSDP)
                    only += best_feasible(perf, rest, n) is None
    print(fits, chosen, only)


if __name__ == "__main__":
    main()
