"""Code placements on the device: a group captured under its own load of the kernel launches
another function handle, computes the same counts bit for bit, and leaves the process's own load
in place afterwards."""

import pytest

pytestmark = pytest.mark.gpu


def test_a_later_group_replays_its_own_load_of_the_kernel(gpu_log):
    import torch

    from moebench.core.codeplace import CodePlacements
    from moebench.core.timing import capture
    from moebench.families.count import kernels as K

    p = {"buffer_tokens": 4096, "tokens": 1000, "topk": 8, "num_experts": 128, "local_experts": 32,
         "local_expert_start": 0, "routing": "uniform", "zipf_s": 1.2, "seed": 3}
    inp = K.build_inputs(p, "cuda", 0)
    fn = K.count_persistent(inp, p, 132, 256, 4)
    fn()
    torch.cuda.synchronize()
    code = CodePlacements()
    with code(0):
        g0 = capture([fn], 1, warmup=1)
    assert len(code.kernels) == 1
    kernel = next(iter(code.kernels))
    own = kernel.function
    with code(1):
        assert kernel.function != own
        g1 = capture([fn], 1, warmup=1)
    assert kernel.function == own
    expected = K.reference(inp, p)
    for g in (g0, g1):
        inp.counts.zero_()  # the kernel adds into its counters (the family resets them so)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(inp.counts, expected)
    gpu_log(f"group 1 captured another load of the kernel than the process's own ({hex(int(own))}); both bit-exact")
