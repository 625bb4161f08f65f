"""Forms of the console pages: they parse what a person typed into the arguments the
registry's functions take. The rules (what a valid split is) stay in ``registry``."""

from __future__ import annotations

import json

from django import forms

from registry.domain.traffic import canary_split

PRESET_WEIGHTS = (1, 10, 50, 100)


class SeenGenerationForm(forms.Form):
    """Every traffic form says which generation the operator saw (a hidden field rendered
    from the page), so a double submit or a second operator is refused instead of acting
    twice. Required here: the console always sends it."""

    expected_generation = forms.IntegerField(
        min_value=0, widget=forms.HiddenInput, label="Generation you saw",
        error_messages={"required": "missing from the form: reload the page and try again"},
    )


class SplitForm(SeenGenerationForm):
    """A canary version and its share of traffic; the stable version gets the rest."""

    canary_version = forms.TypedChoiceField(coerce=int, label="Canary version")
    preset = forms.TypedChoiceField(coerce=int, required=False, choices=[(w, f"{w}%") for w in PRESET_WEIGHTS])
    weight = forms.IntegerField(required=False, min_value=0, max_value=100, label="Canary share (%)")
    reason = forms.CharField(required=False, max_length=500)

    def __init__(self, *args, canary_choices: list[int], stable_version: int | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stable_version = stable_version
        self.fields["canary_version"].choices = [(number, f"v{number}") for number in canary_choices]

    def clean(self):
        data = super().clean()
        # A preset button wins over the exact field: both are in the same form.
        chosen = data.get("preset") if data.get("preset") not in (None, "") else data.get("weight")
        if chosen is None:
            raise forms.ValidationError("choose a preset or type the canary's share (0-100%)")
        data["canary_weight"] = chosen
        return data

    def routes(self) -> list[dict]:
        return canary_split(self.stable_version, self.cleaned_data["canary_version"], self.cleaned_data["canary_weight"])


class ReasonForm(SeenGenerationForm):
    reason = forms.CharField(required=False, max_length=500)


class DrillForm(SeenGenerationForm):
    roll_forward = forms.BooleanField(required=False, label="Restore the current split after the drill")


class UploadForm(forms.Form):
    artifact = forms.FileField(label="ONNX file", allow_empty_file=True)
    description = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class TryForm(forms.Form):
    inputs = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}), label="Inputs (JSON)")

    def clean_inputs(self):
        try:
            return json.loads(self.cleaned_data["inputs"])
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
