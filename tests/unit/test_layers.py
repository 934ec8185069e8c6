"""The engine's source folders are layers: a file includes only from its own
layer or a lower one, so the folder listing is the architecture
(docs/architecture.md)."""

import re
from pathlib import Path

CPP = Path(__file__).resolve().parents[2] / "cpp"

# Lowest first. Layers of equal rank do not include each other.
LAYERS = {
    "core": 0,
    "transport": 1,
    "gpu": 2,
    "negotiation": 3,
    "autotune": 3,
    "ops": 4,
    "engine": 5,
    "bindings": 6,
    "testing": 7,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources():
    return sorted(p for p in CPP.rglob("*") if p.suffix in (".h", ".cc"))


def test_every_source_lives_in_a_known_layer():
    stray = [str(p.relative_to(CPP)) for p in _sources()
             if p.parent == CPP or p.relative_to(CPP).parts[0] not in LAYERS]
    assert not stray, f"sources outside the layer folders {sorted(LAYERS)}: {stray}"


def test_no_include_climbs_a_layer():
    bad = []
    for path in _sources():
        layer = path.relative_to(CPP).parts[0]
        for target in INCLUDE.findall(path.read_text()):
            top = target.split("/")[0]
            if "/" not in target:
                bad.append(f"{path.relative_to(CPP)}: '{target}' is not layer-qualified")
            elif top in LAYERS and top != layer and LAYERS[top] >= LAYERS[layer]:
                bad.append(f"{path.relative_to(CPP)} ({layer}) includes {target} ({top})")
    assert not bad, "\n".join(bad)


def test_includes_name_existing_files():
    third_party = CPP.parent / "third_party"
    missing = []
    for path in _sources():
        for target in INCLUDE.findall(path.read_text()):
            # Gloo's headers are included as "gloo/...", from its own root.
            roots = (CPP, third_party, third_party / "gloo")
            if not any((root / target).exists() for root in roots):
                missing.append(f"{path.relative_to(CPP)}: {target}")
    assert not missing, missing
