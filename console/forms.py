"""Forms of the console pages: they parse what a person typed into the arguments the
registry's functions take. The rules (what a valid split is) stay in ``registry``."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from django import forms
from django.contrib.auth import get_user_model

from registry.actions.rollouts import NOT_PROMISED
from registry.domain.choices import DatasetTask
from registry.domain.reasons import has_visible_text, refuse_control_characters
from registry.domain.tags import InvalidTags, check_tags, parse_typed_tags
from registry.domain.text import refuse_hidden_characters, refuse_reserved_model_name
from registry.domain.traffic import canary_split
from registry.jobs.batch import MAX_BATCH_SIZE
from registry.models import RegisteredModel

PRESET_WEIGHTS = (1, 10, 50, 100)
FULL_WEIGHT = 100  # a share that makes the canary the only route: asked for twice


class SeenGenerationForm(forms.Form):
    """Every traffic form says which generation the operator saw (a hidden field rendered
    from the page), so a double submit or a second operator is refused instead of acting
    twice. Required here: the console always sends it."""

    expected_generation = forms.IntegerField(
        min_value=0, widget=forms.HiddenInput, label="Generation you saw",
        error_messages={"required": "missing from the form: reload the page and try again"},
    )


FORCE_NEEDS_REASON = "force needs a reason: say why traffic goes to a version with incompatible inputs"


class PercentField(forms.IntegerField):
    """A whole percentage typed as text, with or without its sign ("10", "10 %"). A number
    field dropped what it could not read: "0,5" (meant 0.5 %) became 05 and 5 % was applied."""

    def to_python(self, value):
        text = str(value or "").strip().removesuffix("%").strip()
        # Past 100 too: Django's own "Ensure this value is less than or equal to 100" named
        # neither the field's rule nor what was typed, unlike every other wrong share. Leading
        # zeros go and the length is judged before int(), which raises past 4300 digits (a 500).
        digits = text.lstrip("0") or ("0" if text else "")
        if text and not (text.isascii() and text.isdigit() and len(digits) <= 3 and int(digits) <= 100):
            raise forms.ValidationError(f"Enter a whole number from 0 to 100, e.g. 10 (got {str(value).strip()[:20]!r}).", code="invalid")
        return super().to_python(digits)


class SplitForm(SeenGenerationForm):
    """A canary version and its share of traffic; the stable version gets the rest."""

    canary_version = forms.TypedChoiceField(coerce=int, label="Canary version")
    preset = forms.TypedChoiceField(coerce=int, required=False, choices=[(w, f"{w}%") for w in PRESET_WEIGHTS])
    weight = PercentField(required=False, min_value=0, max_value=100, label="Canary share (%)")
    # Sent only by the confirmation's button: 100% replaces the stable, like a promote.
    confirmed_weight = forms.TypedChoiceField(coerce=int, required=False, choices=[(FULL_WEIGHT, f"{FULL_WEIGHT}%")])
    # Sent only by the replacement's confirmation: another version takes the live canary's place.
    confirmed_replace = forms.BooleanField(required=False, widget=forms.HiddenInput)
    reason = forms.CharField(required=False, max_length=500, validators=[refuse_control_characters])
    force = forms.BooleanField(required=False, label="Route it despite incompatible inputs")

    def __init__(self, *args, canary_choices: list[int], stable_version: int | None, live_canaries: list[dict] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.stable_version = stable_version
        self.live_canaries = list(live_canaries)
        self.fields["canary_version"].choices = [(number, f"v{number}") for number in canary_choices]
        # The button pressed decides, and a preset (or the 100% confirmation) leaves the
        # exact field unread: "0.5" left in it had the 1% preset refused for it.
        if self.is_bound and (self.data.get("preset") or self.data.get("confirmed_weight")):
            del self.fields["weight"]

    def clean(self):
        data = super().clean()
        # The confirmation's button, then a preset button, then the exact field: all are
        # in the same form, and only the button pressed is sent.
        confirmed = data.get("confirmed_weight") not in (None, "")
        chosen = data.get("confirmed_weight") if confirmed else data.get("preset") if data.get("preset") not in (None, "") else data.get("weight")
        if chosen is None:
            raise forms.ValidationError("choose a preset or type the canary's share (0-100%)")
        data["canary_weight"] = chosen
        data["needs_confirmation"] = chosen == FULL_WEIGHT and not confirmed
        # Another version in the live canary's place was applied at a click, 50% of v2 gone
        # for 10% of v3: asked first. The 100% confirmation says the split it replaces.
        data["replaces"] = [route for route in self.live_canaries if route["version"] != data.get("canary_version")]
        data["needs_replace_confirmation"] = bool(data["replaces"]) and not (confirmed or data["needs_confirmation"] or data.get("confirmed_replace"))
        if data.get("force") and not has_visible_text(data.get("reason", "")):
            raise forms.ValidationError(FORCE_NEEDS_REASON)
        return data

    def routes(self) -> list[dict]:
        return canary_split(self.stable_version, self.cleaned_data["canary_version"], self.cleaned_data["canary_weight"])


class ReasonForm(SeenGenerationForm):
    reason = forms.CharField(required=False, max_length=500, validators=[refuse_control_characters])


class ToStableForm(ReasonForm):
    # The stable version the dialog promised all the traffic to: while a rollout runs, its
    # abort is refused only when it would now do something else (its steps make generations).
    promised_version = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class PromoteForm(ReasonForm):
    # Shown when the live workers failed to load the canary; the registry asks a reason.
    force = forms.BooleanField(required=False, label="Promote it although the workers failed to load it")


class RestoreForm(ReasonForm):
    # Shown when the restored split routes a version no worker could load; the registry asks a reason.
    force = forms.BooleanField(required=False, label="Restore it although the workers could not load a version it routes")


class DrillForm(SeenGenerationForm):
    # Checked on the page: a drill rolls forward unless the operator unticks it.
    roll_forward = forms.BooleanField(required=False, label="Restore the current split after the drill")


# ---------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class RolloutPlan:
    label: str
    steps: tuple[int, ...]
    step_duration_s: int

    def describe(self) -> str:
        return f"{self.label}: {' → '.join(str(step) for step in self.steps)}, {self.step_duration_s // 60} min per step"


ROLLOUT_PLANS = {
    "standard": RolloutPlan("Standard", (1, 10, 50, 100), 300),
    "quick": RolloutPlan("Quick", (10, 50, 100), 60),
}
CUSTOM_PLAN = "custom"


class RolloutForm(SeenGenerationForm):
    """A canary and a plan: a preset, or custom steps and minutes per step. Whether the
    steps make a plan (increasing, ending at 100) is ``registry.actions.rollouts``' to say."""

    canary_version = forms.TypedChoiceField(coerce=int, label="Canary version")
    plan = forms.ChoiceField(choices=[*((key, plan.describe()) for key, plan in ROLLOUT_PLANS.items()), (CUSTOM_PLAN, "Custom")],
                             initial="standard", label="Plan")
    steps = forms.CharField(required=False, max_length=200, label="Custom steps (%)")
    step_minutes = forms.FloatField(required=False, min_value=0, max_value=7 * 24 * 60, label="Custom minutes per step")
    reason = forms.CharField(required=False, max_length=500, validators=[refuse_control_characters])
    force = forms.BooleanField(required=False, label="Route it despite incompatible inputs")

    def __init__(self, *args, canary_choices: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["canary_version"].choices = [(number, f"v{number}") for number in canary_choices]

    def clean_steps(self) -> list[int] | None:
        text = self.cleaned_data["steps"].strip()
        if not text:
            return None
        items = [item for item in re.split(r"(?:\s|,|;|→|->|%)+", text) if item]  # "10%, 50%, 100%" was refused
        if not all(item.isascii() and item.isdigit() and len(item) <= 9 for item in items):  # "²" is a digit to isdigit
            raise forms.ValidationError("write whole percentages separated by commas, e.g. 1, 10, 50, 100")
        return [int(item) for item in items]

    def clean(self):
        data = super().clean()
        if data.get("plan") == CUSTOM_PLAN:
            if data.get("steps") is None or data.get("step_minutes") is None:
                raise forms.ValidationError("a custom plan needs its steps (e.g. 5, 25, 100) and minutes per step")
            data["plan_steps"], data["step_duration_s"] = data["steps"], round(data["step_minutes"] * 60, 3)
        elif data.get("plan") in ROLLOUT_PLANS:
            plan = ROLLOUT_PLANS[data["plan"]]
            data["plan_steps"], data["step_duration_s"] = list(plan.steps), plan.step_duration_s
        # The registry asks a reason of a forced split; the rollout's own step note must
        # not stand in for the operator's.
        if data.get("force") and not has_visible_text(data.get("reason", "")):
            raise forms.ValidationError(FORCE_NEEDS_REASON)
        return data


class RolloutActionForm(forms.Form):
    """Pause, resume and abort: an optional reason, recorded in the audit timeline, and the
    generation the page showed (resume and abort send it: each may change the traffic, so
    a change made since refuses them; a pause changes none and sends none)."""

    reason = forms.CharField(required=False, max_length=500, validators=[refuse_control_characters])
    expected_generation = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)
    # What the abort dialog promised: "v3" (all the traffic to v3) or "stays". Checked instead
    # of the generation: the rollout's own steps make generations while the dialog is open.
    abort_to = forms.RegexField(required=False, regex=r"^(stays|v[1-9][0-9]{0,8})$", widget=forms.HiddenInput,
                                error_messages={"invalid": "abort_to must be 'stays' or a version like 'v3': reload the page"})

    def promised_target(self):
        """The abort's promise as ``rollouts.abort`` takes it, or NOT_PROMISED."""
        shown = self.cleaned_data.get("abort_to")
        if not shown:
            return NOT_PROMISED
        return None if shown == "stays" else int(shown[1:])


class UploadForm(forms.Form):
    artifact = forms.FileField(label="ONNX file", allow_empty_file=True)
    description = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), validators=[refuse_hidden_characters])
    # Bytes identical to an existing version's are refused unless this says a copy is meant.
    allow_duplicate = forms.BooleanField(required=False, label="Upload as a copy even if identical to an existing version")


# The "try it" form is for rows a person pastes. Any signed-in role may use it, and JSON
# of empty lists grows about 20 times as Python objects: a viewer's 2.6 MB bodies, 16 at a
# time, took the console to 1 GB and held operators' changes 12 s. Larger inputs go to the
# worker's own API, which bounds each version's body.
TRY_INPUT_MAX_CHARS = 256 * 1024


class TryForm(forms.Form):
    # Not stripped before its length is checked: 300,000 spaces around a row passed the bound.
    inputs = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}), label="Inputs (JSON)", strip=False)

    def clean_inputs(self):
        text = self.cleaned_data["inputs"]
        if len(text) > TRY_INPUT_MAX_CHARS:  # before any parsing
            raise forms.ValidationError(f"{len(text):,} characters is more than this form takes ({TRY_INPUT_MAX_CHARS:,}): "
                                        "send larger inputs to the worker's /predict or /v2 API")
        try:
            inputs = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
        except RecursionError:  # the decoder recurses per level: a page of brackets is not a 500
            raise forms.ValidationError("not valid JSON: nested too deeply") from None
        except ValueError as error:  # NaN, Infinity, 1e999, an integer past Python's 4,300 digits
            raise forms.ValidationError(f"not valid JSON for the worker: {str(error)[:120]}") from None
        try:  # what the request to the worker will be: strict JSON in UTF-8
            json.dumps(inputs, ensure_ascii=False, allow_nan=False).encode()
        except UnicodeEncodeError:
            raise forms.ValidationError("a string holds a lone surrogate (e.g. \\ud800), which UTF-8 cannot carry") from None
        return inputs


def _no_constant(word: str):
    raise ValueError(f"{word} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a 64-bit float")
    return value


# ---------------------------------------------------------------- jobs


class BatchJobForm(forms.Form):
    """A batch inference job: the file, and optionally the version (the stable one when
    empty) and batch size. Which files and versions will do is ``batch_jobs.submit``'s to say."""

    input = forms.FileField(label="Input file")
    version = forms.IntegerField(required=False, min_value=1, label="Version")
    batch_size = forms.IntegerField(required=False, min_value=1, max_value=MAX_BATCH_SIZE, label="Batch size")


class DatasetForm(forms.Form):
    """An evaluation data set; whether its file fits the model is ``datasets.add``'s to say."""

    file = forms.FileField(label="Data set file")
    name = forms.SlugField(max_length=100, label="Name")
    task = forms.ChoiceField(choices=DatasetTask.choices, label="Task")
    description = forms.CharField(required=False, max_length=2000, label="Description", validators=[refuse_hidden_characters])


# ---------------------------------------------------------------- the model catalogue


class TagsFormField(forms.CharField):
    """Tags typed as words separated by commas or spaces; ``check_tags`` says what is valid."""

    def to_python(self, value):
        return parse_typed_tags(super().to_python(value) or "")

    def validate(self, value):
        try:
            check_tags(value)
        except InvalidTags as error:
            raise forms.ValidationError(str(error)) from None

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list) else value


def _owner_field() -> forms.ModelChoiceField:
    return forms.ModelChoiceField(queryset=get_user_model().objects.filter(is_active=True).order_by("username"), required=False,
                                  to_field_name="username", label="Owner", empty_label="nobody")


class ModelDetailsForm(forms.Form):
    """Description, tags and owner: what a model page's operator may change."""

    description = forms.CharField(required=False, max_length=2000, label="Description", widget=forms.Textarea(attrs={"rows": 2}),
                                  validators=[refuse_hidden_characters])
    tags = TagsFormField(required=False, max_length=400, label="Tags", help_text="Lowercase words separated by commas, e.g. fraud, cards")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"] = _owner_field()


class VersionDetailsForm(forms.Form):
    """A version's description: what its page's operator may change."""

    description = forms.CharField(required=False, max_length=2000, label="Description", validators=[refuse_hidden_characters])


class ModelCreateForm(ModelDetailsForm):
    name = forms.SlugField(max_length=100, label="Name", help_text="Letters, digits, '-' and '_'; it names the model in URLs and requests.",
                           validators=[refuse_reserved_model_name])
    field_order = ("name", "description", "tags", "owner")

    def clean_name(self):
        name = self.cleaned_data["name"]
        if RegisteredModel.objects.filter(name=name).exists():
            raise forms.ValidationError(f"a model named {name!r} already exists")
        return name


MODEL_SORTS = {"name": "Name (A–Z)", "updated": "Last updated", "created": "Newest first", "requests": "Requests/s (busiest first)"}


class ModelListForm(forms.Form):
    """The Models page's query string: search, filters and order (all optional)."""

    q = forms.CharField(required=False, max_length=100, label="Search")
    tag = forms.ChoiceField(required=False, label="Tag")
    owner = forms.ChoiceField(required=False, label="Owner")
    sort = forms.ChoiceField(required=False, choices=list(MODEL_SORTS.items()), label="Sort by")
    archived = forms.BooleanField(required=False, label="Show archived")
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args, tags: list[str], owners: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tag"].choices = [("", "any tag"), *((tag, tag) for tag in tags)]
        self.fields["owner"].choices = [("", "anyone"), *((owner, owner) for owner in owners)]


class ArchiveForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500, validators=[refuse_control_characters], label="Reason (optional)")
