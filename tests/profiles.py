"""How hard the searching tests search, by profile (`HYPOTHESIS_PROFILE`; not ROQ_-prefixed, which
the configuration would read as a setting):

- `ci` (the default): the example counts each test names, sized so the suite stays in CI's time;
- `thorough`: ten times as many, for a nightly or pre-release run (`make test-thorough`);
- `quick`: a fifth, while editing.

Each test names its count through `examples(n)`, so one setting scales them all; the profile of
the same name is loaded in tests/conftest.py for Hypothesis's own defaults."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALES = {"quick": 0.2, "ci": 1.0, "thorough": 10.0}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in SCALES:
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: must be one of {', '.join(SCALES)}")


def examples(count: int, profile: str = PROFILE) -> int:
    """`count` examples as `profile` (the active one) scales them, at least 1."""
    return max(1, round(count * SCALES[profile]))


def load_profile() -> None:
    """Hypothesis's defaults for tests that name no count: 100 examples scaled by the profile."""
    for name in SCALES:
        settings.register_profile(name, max_examples=examples(100, name), deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.load_profile(PROFILE)
