"""Forms of the hosts' pages (every one is posted with its CSRF token)."""

from django import forms

REGION_HELP = (
    "a short code renters can ask for in placement, e.g. eu, us-east (optional)"
)


class MachineRegisterForm(forms.Form):
    """Register a machine: its name and region."""

    name = forms.CharField(max_length=100, help_text="e.g. the desktop's name")
    region = forms.CharField(max_length=32, required=False, help_text=REGION_HELP)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the machine a name.")
        return name


class MachineSettingsForm(forms.Form):
    """The owner's settings of a machine: region and whether it takes serverless jobs."""

    region = forms.CharField(max_length=32, required=False, help_text=REGION_HELP)
    accepts_serverless = forms.BooleanField(
        required=False,
        label="Accept serverless jobs",
        help_text="jobs from any renter's API calls",
    )


class PauseForm(forms.Form):
    """Pause (true) or resume (false) a machine."""

    paused = forms.TypedChoiceField(
        choices=[("1", "pause"), ("0", "resume")], coerce=lambda v: v == "1"
    )
