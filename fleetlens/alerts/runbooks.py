"""What to do when an alert fires: the first steps for each rule of the default policy.

Every alert carries a ``runbook_url`` annotation (the Prometheus convention, which Alertmanager
receivers show): the rule's own ``runbook_url`` when the policy sets one (a team's wiki), else
the server's ``/runbooks#<alertname>`` page, which renders these steps beside the rule as the
policy in force defines it.
"""

from __future__ import annotations

from .policy import Rule

__all__ = ["RUNBOOKS", "runbook_url"]

_FAILURE = "Open the run's failure page (linked from the alert on the On-call page)"

RUNBOOKS: dict[str, tuple[str, ...]] = {
    "GoodputLow": (
        "Open the run page: the breakdown names the category that took the time (restarts, "
        "stragglers, data waits, checkpoints, hangs) and What's wrong names the finding behind it.",
        "If a finding names a node or GPU, its owner acts on it (remediation for hardware, the "
        "data pipeline's owner for data stalls); `fleetlens goodput RUN` prints the same figures.",
        "A goodput that is low by design (a job that checkpoints often, say) is tuned per run or "
        "project: the rule's threshold is overridable in the alert policy.",
    ),
    "JobHang": (
        f"{_FAILURE}: it names the ranks the others wait for and where they stopped (step, "
        "phase) from their heartbeats.",
        "With PyTorch's Flight Recorder on, the job dumps its NCCL trace by itself; else run "
        "`fleetlens fr import` on the dumps: the hang finding names the collective and the ranks "
        "that never entered it.",
        "A hung rank on a node with a hardware finding: approve the remediation action (the job "
        "re-forms without the node from its newest verified checkpoint). Otherwise restart the "
        "job from its last checkpoint and keep the dumps.",
    ),
    "FatalHardwareFault": (
        "The node's GPU is gone (Xid 79, 48 ...): the job cannot continue on it. Check the "
        "remediation action on the On-call page: approve it to drain the node and resume on the "
        "others from the newest verified checkpoint (confirmation asked).",
        "Cordon the node in the scheduler (Slurm `scontrol update nodename=N state=drain`, "
        "Kubernetes `kubectl cordon N`) until the hardware is replaced or reset.",
        "Open a hardware ticket with the Xid, GPU serial and the node's DCGM samples (the run's "
        "ranks endpoint shows them).",
    ),
    "RecoverableHardwareFault": (
        "Thermal, rack cooling, NVLink or correctable ECC: the job runs, slower. The finding names "
        "the node and GPU; the run page's rank view shows its SM clock, temperature and power.",
        "Check the rack's cooling (several nodes of a rack at once) or the node's fabric (NVLink "
        "CRC errors); drain the node at the job's next checkpoint if it keeps slowing the job.",
    ),
    "NodeDrained": (
        "A node the job used was drained, cordoned or taken for maintenance: confirm that the job "
        "re-formed without it (the run page's remediation table) or was rescheduled.",
        "Return the node to service once the maintenance ends; nothing to do for the job if it "
        "resumed.",
    ),
    "StragglerSpread": (
        "One or a few ranks are slower than the others: the run page's What's wrong names the "
        "rank, node and GPU, since when and the GPU-hours it cost.",
        "Persistent on one GPU: check its clocks and temperature (hardware); moving between "
        "ranks: suspect data skew (sequence lengths) or the host (CPU, memory).",
    ),
    "ThroughputDrop": (
        "Tokens/s or step time is worse than the run's own baseline: the finding says which "
        "(network, data stall, slow checkpoint, host, inefficient compute).",
        "Compare with an earlier run (`fleetlens compare A B` or the Compare page) to tell a "
        "configuration change from an infrastructure one.",
    ),
    "TrainingInstability": (
        "NaN/Inf in the loss or an out-of-memory error: the training code's owner looks at the "
        "step it happened at (the failure page's training signals before it).",
        "Restart from the checkpoint before the loss went bad, with a lower learning rate or "
        "skipped batch; an OOM names the bytes requested and free.",
    ),
    "TensorParallelSplit": (
        "Tensor-parallel groups span NVLink domains or nodes: their all-reduces go over the "
        "network. Fix the placement (rank order, node list) at the next restart.",
    ),
    "PipelineStageImbalance": (
        "One pipeline stage computes longer than the others at every data-parallel replica: "
        "the layers are split unevenly (the last stage also computes the loss and the output "
        "embedding). No node is at fault: do not drain one.",
        "Move layers off that stage at the next restart (Megatron "
        "--decoder-last-pipeline-num-layers or --account-for-loss-in-pipeline-split, torchtitan "
        "pipeline_parallel_layers_per_stage); the finding says how much faster the job would be.",
    ),
    "BatchImbalance": (
        "The data-parallel replicas' batches cost unevenly: from step to step one replica computes "
        "longer at every pipeline stage (longer sequences, fuller packing) and every step waits "
        "for it. The replica that is slowest moves: no node is at fault, do not drain one.",
        "Balance the tokens per replica (sequence packing, length-grouped sampling, a token "
        "budget per micro-batch); the finding says how much faster even batches would be.",
    ),
    "PerformanceRegression": (
        "A run is past the fleet baseline of one tier: its median step time or its time from "
        "job start to first step, its recovery from a restart or its checkpoint pauses (against "
        "the earlier runs of the same model config and world size), its MFU or its GPU time a "
        "token (the same architecture at any scale), its scaling efficiency over its smallest "
        "runs (small-scale canaries, against the software it replaced) or its wait for a "
        "complete allocation "
        "(its pool's earlier allocations of a like size). The finding names the versions that "
        "differ (an image, torch, CUDA, NCCL, the driver): a new version that coincides is the "
        "first suspect. `fleetlens regression RUN` shows the run against each baseline.",
        "Run a small canary of the workload on the previous image and on the new one, at one "
        "node and at two; if the new one is slower or scales worse, hold its rollout and bisect "
        "the change (kernels, collectives, compilation). A startup or recovery regression with "
        "an unchanged step time points at compilation, loading, the rendezvous or the restart "
        "automation; a checkpoint one at storage; an allocation one at the pool's policy.",
    ),
    "MemoryClimb": (
        "A rank's memory grows step after step (the device's allocator, or the process's) and, at "
        "this pace, reaches its limit within the steps the finding says: the run will end in an "
        "out-of-memory error. `fleetlens memory RUN` shows every rank's climb.",
        "Find what the loop keeps from one step to the next: outputs or losses kept as tensors "
        "(keep `.item()` or a detached copy on the CPU), a cache or a list that grows; restart "
        "from the last checkpoint with the fix before the limit is reached.",
    ),
    "MFUDrop": ("MFU fell against the run's previous hour: see ThroughputDrop's steps.",),
    "TokensPerSecondDrop": ("Tokens/s fell against the run's previous hour: see ThroughputDrop.",),
    "GPUTemperatureHigh": (
        "A GPU runs above its slowdown temperature: check the node's and rack's cooling; the "
        "GPU will throttle its clocks (a thermal straggler follows).",
    ),
    "CommunicationRatioHigh": (
        "Collectives take a large share of the step: check the network (NIC errors, "
        "retransmits) and the parallel layout (TensorParallelSplit).",
    ),
    "RankStepTimeSpread": ("The slowest rank's step is far over the mean: see StragglerSpread.",),
    "DataloaderWaitHigh": (
        "Ranks wait for data: the data-stall finding traces it to the dataset shard, the "
        "storage or the prefetch (Run.data); add loader workers or prefetch, or fix the shard.",
    ),
    "PrefetchQueueEmpty": ("The prefetch queue runs dry: see DataloaderWaitHigh.",),
    "StorageLatencyUp": (
        "Storage reads are slower than the run's previous hour: check the storage system's "
        "health and other jobs reading it.",
    ),
    "EvalSafetyRegression": (
        "A candidate model version failed a safety gate against production: do not promote it "
        "(its alias moves are refused without an override). The evaluation page lists the "
        "examples it answered harmfully.",
    ),
    "EvalBenchmarkRegression": (
        "A candidate scores worse than production on a benchmark: the model page shows the gate's "
        "paired statistics; the evaluation page the examples it got wrong.",
    ),
    "EvalLatencyRegression": (
        "A candidate answers slower than production (p95): check its serving configuration "
        "(batch size, decoding) before promoting it.",
    ),
    "EvalCostRegression": (
        "A candidate costs more per example than production or its bound: check tokens out per "
        "example (longer answers) and the price table.",
    ),
}


def runbook_url(rule: Rule, base_url: str = "") -> str:
    """Where an alert of ``rule`` says to look: the rule's own runbook, or this server's."""
    return rule.runbook_url or f"{base_url}/runbooks#{rule.name}"
