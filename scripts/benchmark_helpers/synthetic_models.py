"""The synthetic benchmark's models and batch (a helper: no hvdcompat here, so Horovod's
own environment can build the same model, scripts/horovod_side_by_side.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- models

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-18's shape (width 64 is its full width): four stages of two blocks."""

    def __init__(self, num_classes=1000, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        layers, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MLP(nn.Module):
    def __init__(self, in_features, num_classes=1000, hidden=2048):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class SmallTransformer(nn.Module):
    """A 2-layer encoder over token sequences, mean-pooled into a classifier."""

    def __init__(self, vocab=8000, d_model=128, heads=4, layers=2, seq_len=64, num_classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        x = self.encoder(self.embed(tokens) + self.pos[:, :tokens.shape[1]])
        return self.head(x.mean(dim=1))


def build(args):
    """(model, inputs, targets, unit) for the chosen model."""
    n = args.batch_size
    if args.model == "resnet":
        model = SmallResNet(width=args.resnet_width)
        data = torch.randn(n, 3, args.image_size, args.image_size)
        target = torch.randint(0, 1000, (n,))
        unit = "img"
    elif args.model == "mlp":
        model = MLP(3 * args.image_size * args.image_size)
        data = torch.randn(n, 3, args.image_size, args.image_size)
        target = torch.randint(0, 1000, (n,))
        unit = "img"
    else:
        model = SmallTransformer(seq_len=args.seq_len)
        data = torch.randint(0, 8000, (n, args.seq_len))
        target = torch.randint(0, 10, (n,))
        unit = "samples"
    return model, data, target, unit
