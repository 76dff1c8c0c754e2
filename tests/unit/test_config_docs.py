"""docs/config.md is generated from the settings' declarations (roq/config/docs.py): it is up to
date, and every setting is declared with a description."""

from __future__ import annotations

from dataclasses import fields

from roq.config import Config
from roq.config.docs import DOC, every_setting, main, render


def test_every_setting_is_declared_with_a_description() -> None:
    settings = every_setting()  # a field not declared with setting() raises here
    assert {s.name for s in settings} == {f"{section}.{key}" for section, keys in Config().to_dict().items()
                                          for key in keys}
    assert [s.name for s in settings if len(s.help.split()) < 2] == []
    assert [s.name for s in settings if s.default != getattr(getattr(Config(), s.section), s.key)] == []
    assert [f.name for f in fields(Config) if not (type(getattr(Config(), f.name)).__doc__ or "").strip()] == []


def test_docs_config_md_is_up_to_date() -> None:
    assert main(["--check"]) == 0, "docs/config.md is out of date: run python -m roq.config.docs"


def test_docs_config_md_names_every_setting_and_its_variable() -> None:
    text = DOC.read_text()
    assert text == render()
    for s in every_setting():
        assert f"| `{s.key}` <br>`ROQ_{s.section.upper()}_{s.key.upper()}` |" in text, s.name
