"""The weight board and its published form, FlatWeights (one buffer per dtype)."""

from __future__ import annotations

import io
import multiprocessing

import torch

from trainer.weights import FlatWeights, WeightBoard


def mixed_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 3, generator=g),
        "layer.norm": torch.randn(3, generator=g).to(torch.bfloat16),
        "layer.proj": torch.randn(3, 5, generator=g).t(),  # not contiguous
        "count": torch.tensor(4, dtype=torch.long),  # a 0-d buffer
        "head.weight": torch.randn(2, 3, generator=g),
    }


def test_flat_weights_hold_a_copy_of_every_tensor_in_one_buffer_per_dtype() -> None:
    sd = mixed_state_dict()
    flat = FlatWeights(sd)
    got = flat.tensors()
    assert list(got) == list(sd)
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name
    assert sorted(map(str, flat.buffers)) == ["torch.bfloat16", "torch.float32", "torch.int64"]
    assert flat.buffers[torch.float32].numel() == 21 + 15 + 6
    # views into the buffers, not copies; and a copy of the source, not the source
    got["embed.weight"][0, 0] = 123.0
    assert flat.buffers[torch.float32][0] == 123.0
    sd["head.weight"].zero_()
    assert got["head.weight"].abs().sum() > 0


def _child(conn) -> None:  # noqa: ANN001 - a multiprocessing connection
    flat = conn.recv()
    out = io.BytesIO()  # sent back as bytes: this process may exit before shared tensors are fetched
    torch.save(flat.tensors(), out)
    conn.send_bytes(out.getvalue())
    conn.send(len(flat.buffers))


def test_flat_weights_cross_a_spawned_process_intact() -> None:
    import torch.multiprocessing  # noqa: F401 - torch's reductions for tensors over a pipe

    sd = mixed_state_dict()
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(theirs,))
    proc.start()
    try:
        sent = FlatWeights(sd)  # held until the child has it, as the board holds a version
        ours.send(sent)
        back = torch.load(io.BytesIO(ours.recv_bytes()))
        assert ours.recv() == 3  # one buffer per dtype arrived, not one tensor per parameter
    finally:
        proc.join(timeout=60)
    assert list(back) == list(sd)
    for name, t in sd.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_the_board_hands_out_state_dicts_and_tells_listeners_the_flat_form() -> None:
    model = torch.nn.Linear(3, 2)
    board = WeightBoard()
    told: list[tuple[str, int | None, object]] = []
    board.add_listener(lambda event, version, weights: told.append((event, version, weights)))
    board.publish(1, model)
    with torch.no_grad():
        model.weight.add_(1.0)  # the board holds a copy
    held = board.wait_for(1)
    assert set(held) == {"weight", "bias"} and not torch.equal(held["weight"], model.weight)
    assert torch.equal(held["weight"] + 1.0, model.weight.detach())
    assert board.get(1) is not None and board.get(2) is None
    assert told[0][:2] == ("publish", 1) and isinstance(told[0][2], FlatWeights)
    # a receiver publishes what it was handed, without copying it again
    incoming = FlatWeights(model.state_dict())
    board.publish(2, incoming, copy=False)
    assert board.get(2)["weight"].data_ptr() == incoming.tensors()["weight"].data_ptr()
    board.drop_below(2)
    assert board.get(1) is None and told[-1] == ("drop", 2, None)
