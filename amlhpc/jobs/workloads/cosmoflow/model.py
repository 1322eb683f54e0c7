"""The CosmoFlow 3D CNN (MLPerf HPC reference, in PyTorch).

Conv blocks (Conv3d kernel 2, 'same'-style padding, LeakyReLU 0.3, MaxPool3d 2) with
conv_size x 2^i channels, then three fully connected layers (fc1, fc2, 4 targets) with
tanh on the output scaled by 1.2 (the targets are normalised to [-1, 1]); as in the
MLPerf HPC CosmoFlow reference (conv_size 32, 5 conv layers, fc 128/64 for 128^3 inputs).
"""

from __future__ import annotations

import torch
from torch import nn


class CosmoFlow(nn.Module):
    def __init__(self, volume: int = 128, channels: int = 4, conv_size: int = 32, n_conv_layers: int = 5,
                 fc1: int = 128, fc2: int = 64, targets: int = 4, dropout: float = 0.0):
        super().__init__()
        if volume % (2 ** n_conv_layers):
            raise ValueError(f"volume {volume} must be divisible by 2^{n_conv_layers} (one max-pool per conv layer)")
        blocks: list[nn.Module] = []
        in_ch = channels
        for i in range(n_conv_layers):
            out_ch = conv_size * 2 ** i
            # kernel 2 with asymmetric padding keeps the size ('same' in Keras), then halve it
            blocks += [nn.ConstantPad3d((0, 1, 0, 1, 0, 1), 0.0), nn.Conv3d(in_ch, out_ch, kernel_size=2),
                       nn.LeakyReLU(0.3), nn.MaxPool3d(2)]
            in_ch = out_ch
        self.features = nn.Sequential(*blocks)
        side = volume // 2 ** n_conv_layers
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_ch * side ** 3, fc1), nn.LeakyReLU(0.3), nn.Dropout(dropout),
            nn.Linear(fc1, fc2), nn.LeakyReLU(0.3), nn.Dropout(dropout),
            nn.Linear(fc2, targets), nn.Tanh(),
        )
        for module in self.modules():
            if isinstance(module, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.2 * self.head(self.features(x))
