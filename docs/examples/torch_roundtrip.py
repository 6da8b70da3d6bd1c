"""Move a trained PyTorch LSTM through pycudnnrnn and back.

Run: python docs/examples/torch_roundtrip.py (needs torch; CPU is enough).
"""

import warnings

import numpy as np
import torch

import pycudnnrnn
from pycudnnrnn import convert
from pycudnnrnn.torch import CudnnRNN

torch.manual_seed(0)
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")

# 1. A small bidirectional LSTM with a projection, trained a little in PyTorch
#    to echo a running mean of its input.
lstm = torch.nn.LSTM(input_size=3, hidden_size=16, num_layers=2, bidirectional=True,
                     proj_size=4)
head = torch.nn.Linear(8, 3)
x = torch.randn(20, 8, 3)                       # [T, B, input_size]
target = x.cumsum(0) / torch.arange(1, 21).view(20, 1, 1)
optimizer = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=0.01)
for step in range(50):
    optimizer.zero_grad()
    loss = (head(lstm(x)[0]) - target).square().mean()
    loss.backward()
    optimizer.step()
print(f"PyTorch training loss: {loss.item():.4f}")

# 2. Its weights as one opaque cuDNN-layout buffer, plus the attributes that describe it.
params, attrs = convert.from_torch(lstm)
print(attrs)   # rnn_mode, num_layers, num_units, input_size, direction, num_proj

# 3. The same network through pycudnnrnn's functional API (NumPy on the CPU; CuPy or
#    CUDA tensors would run on cuDNN). Sequences may have different lengths.
lengths = [20, 20, 15, 20, 7, 20, 0, 20]
h0 = np.zeros((4, 8, 4), np.float32)            # [L·D, B, num_proj]
c0 = np.zeros((4, 8, 16), np.float32)           # [L·D, B, num_units]
y, hy, cy, reserve = pycudnnrnn.forward(x.numpy(), h0, c0, params.numpy(), lengths, **attrs)

packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths).clamp(min=1),
                                                 enforce_sorted=False)
with torch.no_grad():
    reference = torch.nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], total_length=20)[0]
full = [b for b, n in enumerate(lengths) if n > 0]
print("max |pycudnnrnn - PyTorch|:", float(np.abs(y[:, full] - reference.numpy()[:, full]).max()))

# 4. Fine-tune it as a pycudnnrnn module: one flat `params` parameter, ragged batches.
model = CudnnRNN(3, 16, 2, rnn_mode="lstm", bidirectional=True, num_proj=4)
with torch.no_grad():
    model.params.copy_(params)
optimizer = torch.optim.Adam([model.params, *head.parameters()], lr=0.01)
mask = (torch.arange(20).view(20, 1) < torch.tensor(lengths).view(1, 8)).unsqueeze(-1)
for step in range(21):
    optimizer.zero_grad()
    output, h_n, c_n = model(x, sequence_lengths=lengths)
    loss = ((head(output) - target).square() * mask).sum() / mask.sum()
    if step in (0, 20):
        print(f"loss on ragged batches, step {step}: {loss.item():.4f}")
    loss.backward()
    optimizer.step()

# 5. And back to a plain nn.LSTM, with the fine-tuned weights.
lstm_again = convert.to_torch(model.params.detach(), **attrs)
with torch.no_grad():
    same = torch.allclose(lstm_again(x)[0], model(x)[0], atol=1e-6)
print("to_torch gives the same network:", same)
assert same
