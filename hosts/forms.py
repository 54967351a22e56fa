"""Forms of the hosts' pages (every one is posted with its CSRF token)."""

from django import forms

from .regions import region_choices, region_clean
from .services import machine_name_clean

REGION_HELP = "where the machine is: renters can ask for a region in placement"


class RegionField(forms.ChoiceField):
    """A region code of ``hosts.regions`` (case and spaces ignored) or empty."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", REGION_HELP)
        super().__init__(choices=region_choices, required=False, **kwargs)

    def to_python(self, value) -> str:
        return (value or "").strip().lower()

    def validate(self, value) -> None:
        try:
            region_clean(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="region") from None


class MachineNameField(forms.CharField):
    """A machine's name (``hosts.services.machine_name_clean``'s rules)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "e.g. the desktop's name; yours are unique")
        super().__init__(max_length=100, **kwargs)

    def clean(self, value) -> str:
        value = super().clean(value)
        try:
            return machine_name_clean(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).capitalize() + ".") from None


class MachineRegisterForm(forms.Form):
    """Register a machine: its name and region."""

    name = MachineNameField()
    region = RegionField()


class MachineSettingsForm(forms.Form):
    """The owner's settings of a machine: region and whether it takes serverless jobs."""

    region = RegionField()
    accepts_serverless = forms.BooleanField(
        required=False,
        label="Accept serverless jobs",
        help_text="jobs from any renter's API calls",
    )


class MachineRenameForm(forms.Form):
    """A new name for the machine."""

    name = MachineNameField(label="New name")


class ConfirmForm(forms.Form):
    """A destructive action's tick box (retire): it must be ticked."""

    confirm = forms.BooleanField(
        required=True,
        error_messages={"required": "Tick the box to confirm."},
    )


class PauseForm(forms.Form):
    """Pause (true) or resume (false) a machine."""

    paused = forms.TypedChoiceField(
        choices=[("1", "pause"), ("0", "resume")], coerce=lambda v: v == "1"
    )
