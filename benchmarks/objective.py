"""Time the vectorised FlashREINFORCE loss + backward against a per-row loop form.

    python benchmarks/objective.py                       # B=128, T=2048 (the issue's size)
    python benchmarks/objective.py --batch 32 --length 512 --repeats 5

Both forms compute the same objective (sample-mean, trust-region gate, importance ratio) on the
same random batch; the script checks that their losses and gradients agree, then prints the
median time of each and their ratio (loop / vectorised), measured in this one run. On CPU the
clock is the process's CPU time with one thread by default, so a busy machine does not skew it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from trainer.objective import flashreinforce_loss


def make_batch(b: int, t: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Rows with a prompt, some policy tokens and right padding; behaviour close to current."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, max(2, t // 8), (b,), generator=g)
    length = torch.randint(t // 2, t + 1, (b,), generator=g)
    pos = torch.arange(t)[None, :]
    mask = (pos >= prompt[:, None]) & (pos < length[:, None])
    mask[:, 0] = False
    mask[torch.arange(b), prompt.clamp(max=t - 1)] = True  # at least one policy token per row
    current = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3.0
    behaviour = (current + 0.01 * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=0.0)
    return {
        "log_probs": current.to(dtype),
        "behavior_log_probs": behaviour.to(dtype),
        "rewards": torch.randint(0, 2, (b,), generator=g).to(dtype),
        "action_mask": mask,
    }


def loop_form(log_probs, behavior_log_probs, rewards, action_mask, delta):  # type: ignore[no-untyped-def]
    """The objective row by row, the way one would first write it."""
    b = log_probs.shape[0]
    adv = rewards - rewards.mean()
    total = log_probs.new_zeros(())
    for i in range(b):
        m = action_mask[i]
        cur = log_probs[i][m]
        beh = behavior_log_probs[i][m]
        p = beh.exp().clamp(1e-6, 1 - 1e-6)
        q = cur.detach().exp().clamp(1e-6, 1 - 1e-6)
        kl = (p * (p.log() - q.log()) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))).mean().clamp(min=0)
        if kl > delta:
            continue
        rho = (cur.detach() - beh).exp()
        total = total - (rho * adv[i] * cur).mean()
    return total / b


def time_it(fn, repeats: int, clock) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128, help="B, rows (default 128)")
    ap.add_argument("--length", type=int, default=2048, help="T, tokens per row (default 2048)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--delta", type=float, default=3e-3)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared machine)"
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    batch = {k: v.to(device) for k, v in make_batch(args.batch, args.length, dtype, seed=0).items()}

    def run(form: str) -> tuple[torch.Tensor, torch.Tensor]:
        lp = batch["log_probs"].clone().requires_grad_(True)
        if form == "vectorised":
            loss, _ = flashreinforce_loss(
                lp, batch["behavior_log_probs"], batch["rewards"], batch["action_mask"], delta=args.delta
            )
        else:
            loss = loop_form(
                lp, batch["behavior_log_probs"], batch["rewards"], batch["action_mask"], args.delta
            )
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return loss.detach(), lp.grad  # type: ignore[return-value]

    v_loss, v_grad = run("vectorised")
    l_loss, l_grad = run("loop")
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    if not math.isclose(float(v_loss), float(l_loss), rel_tol=tol, abs_tol=tol):
        raise SystemExit(f"the two forms disagree: loss {float(v_loss)} vs {float(l_loss)}")
    torch.testing.assert_close(v_grad, l_grad, rtol=tol, atol=tol)

    run("vectorised")  # warm-up
    # On CPU, process CPU time: other jobs on a shared machine do not inflate it. On CUDA, wall time.
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    t_vec = time_it(lambda: run("vectorised"), args.repeats, clock)
    t_loop = time_it(lambda: run("loop"), args.repeats, clock)
    tokens = int(batch["action_mask"].sum())
    print(
        f"FlashREINFORCE loss + backward, B={args.batch} T={args.length} {args.dtype}, "
        f"{tokens} policy tokens, {args.device}, threads={torch.get_num_threads()}, "
        f"median of {args.repeats} ({'process CPU' if device.type == 'cpu' else 'wall'} time)"
    )
    print(f"  vectorised : {t_vec * 1e3:9.1f} ms")
    print(f"  loop form  : {t_loop * 1e3:9.1f} ms")
    print(f"  ratio loop/vectorised: {t_loop / t_vec:.1f}x")


if __name__ == "__main__":
    main()
