"""Server-rendered pages for hosts: dashboard, machine registration, machine page.

Thin: parse, call a selector or a service, render. Every machine is looked up
through ``selectors.machine_of_owner`` so another owner's machine is a 404.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from billing.templatetags.billing_money import usd_text
from catalog.gpus import MEASURED_MIN_JOBS

from . import selectors, services, timeline, web_services
from .charts import bar_chart, score_chart
from .forms import (
    ConfirmForm,
    MachineRegisterForm,
    MachineRenameForm,
    MachineSettingsForm,
    PauseForm,
)
from .models import Machine

NEW_TOKEN_SESSION_KEY = "ballast_new_machine_token"


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: what Ballast is and where the API lives."""
    return render(request, "hosts/home.html")


# How a host installs the agent: its own distribution (agent/pyproject.toml), with
# llama.cpp and the default model as the ``llamacpp`` extra
AGENT_INSTALL = "pipx install 'ballast-agent[llamacpp]'"
PLACEHOLDER = "<this machine's token>"  # the token is shown once, at registration


def agent_command(request: HttpRequest, token: str) -> str:
    """The exact command a host pastes on their machine once the agent is
    installed (``AGENT_INSTALL``): the console script of ``ballast-agent``."""
    base_url = request.build_absolute_uri("/").rstrip("/")
    return f"ballast-agent run --server {base_url} --token {token}"


@login_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    """The host's machines with live status; the rows refresh by htmx polling."""
    now = timezone.now()
    return render(
        request,
        "hosts/dashboard.html",
        {
            "rows": selectors.machine_rows(user=request.user, now=now),
            "retired": selectors.machines_retired(user=request.user),
            "earnings": selectors.host_earnings(user=request.user),
            "form": MachineRegisterForm(),
        },
    )


@login_required
@require_GET
def machine_rows(request: HttpRequest) -> HttpResponse:
    """The dashboard's live rows alone (the htmx fragment); a full page without htmx."""
    if not request.htmx:
        return redirect("hosts:dashboard")
    rows = selectors.machine_rows(user=request.user, now=timezone.now())
    return render(request, "hosts/_machine_rows.html", {"rows": rows})


@login_required
def machine_register(request: HttpRequest) -> HttpResponse:
    """Register a machine; its token is shown once, on the machine page that follows."""
    form = MachineRegisterForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            machine, token = services.machine_register(
                owner=request.user,
                name=form.cleaned_data["name"],
                region=form.cleaned_data["region"],
            )
        except services.MachineNameTaken:
            form.add_error("name", NAME_TAKEN)
        else:
            request.session[NEW_TOKEN_SESSION_KEY] = {
                "machine": str(machine.id),
                "token": token,
            }
            return redirect("hosts:machine", machine_id=machine.id)
    return render(request, "hosts/machine_register.html", {"form": form})


NAME_TAKEN = (
    "You already have a machine of this name: pick another, or retire the old one."
)


@login_required
@require_GET
def machine_page(request: HttpRequest, machine_id) -> HttpResponse:
    """One machine: its live part (status, waiting for the first heartbeat,
    devices' telemetry), online timeline, score parts, jobs and why a segment
    earned nothing, rentals and why one ended early, earnings, failed
    capabilities, benchmarks and charts. Staff read any machine's page (its
    controls are its owner's alone)."""
    machine, is_owner = selectors.machine_of_viewer(
        user=request.user, machine_id=machine_id
    )
    now = timezone.now()
    new_token = None
    pending = request.session.get(NEW_TOKEN_SESSION_KEY)
    if pending and pending.get("machine") == str(machine.id):
        new_token = pending["token"]
        del request.session[NEW_TOKEN_SESSION_KEY]  # shown once
    earnings = selectors.earnings_by_machine(machines=[machine])[machine.id]
    daily = selectors.machine_earnings_daily(machine=machine, now=now)
    history = selectors.machine_score_history(machine=machine, now=now)
    score_charts = [
        (label, *score_chart(samples, now=now, window=selectors.SCORE_HISTORY))
        for label, samples in history.items()
    ]
    earnings_chart = bar_chart(
        [(day.strftime("%d %b"), total, usd_text(total)) for day, total in daily],
        fmt=lambda nano: usd_text(int(nano)) if nano else "$0",  # (the axis' zero)
    )
    days = timeline.machine_timeline(machine=machine, now=now)
    context = {
        **_live_context(request, machine, now),
        "is_owner": is_owner,
        "notices": selectors.machine_notices(machine=machine, now=now),
        "agent_command": agent_command(request, new_token or PLACEHOLDER),
        "earnings": earnings,
        "timeline": days,
        "timeline_share": timeline.timeline_share(days),
        "timeline_minutes": timeline.MINUTES,
        "attempts": selectors.machine_attempts(machine=machine),
        "rentals": selectors.machine_rentals(machine=machine),
        "rental_away_limit_s": f"{settings.BALLAST_RENTAL_OFFLINE_END_S:g}",
        "failed_capabilities": machine.failed_capabilities.order_by("-last_at"),
        "benchmarks": selectors.machine_benchmarks(machine=machine),
        "score_charts": score_charts,
        "earnings_chart": earnings_chart,
        "earnings_days": len(daily),
        "settings_form": MachineSettingsForm(
            initial={
                "region": machine.region,
                "accepts_serverless": machine.accepts_serverless,
            }
        ),
        "rename_form": MachineRenameForm(initial={"name": machine.name}),
        "new_token": new_token,
        "agent_install": AGENT_INSTALL,
        "parts": selectors.device_views(machine=machine, now=now),
        "measured_min_jobs": MEASURED_MIN_JOBS,
    }
    return render(request, "hosts/machine.html", context)


def _live_context(request: HttpRequest, machine: Machine, now) -> dict:
    """What the machine page's live part (``hosts/_machine_live.html``) shows:
    status, last heartbeat, the waiting state with the agent command (the
    token left out: it is shown once, above it), devices."""
    return {
        "machine": machine,
        "status": selectors.machine_status(machine, now),
        "waiting": selectors.machine_waiting(machine),
        "last_seen": machine.seen_until(),
        "heartbeat_max_age_s": f"{settings.BALLAST_HEARTBEAT_MAX_AGE_S:g}",
        "max_temp_c": f"{settings.BALLAST_MAX_GPU_TEMP_C:g}",
        "server_url": request.build_absolute_uri("/").rstrip("/"),
        "waiting_command": agent_command(request, PLACEHOLDER),
        "devices": selectors.device_views(machine=machine, now=now, parts=False),
    }


@login_required
@require_GET
def device_rows(request: HttpRequest, machine_id) -> HttpResponse:
    """The machine page's live part alone (the htmx fragment, polled): status,
    waiting for the first heartbeat, devices' temperature and VRAM."""
    machine, _ = selectors.machine_of_viewer(user=request.user, machine_id=machine_id)
    if not request.htmx:
        return redirect("hosts:machine", machine_id=machine.id)
    return render(
        request,
        "hosts/_machine_live.html",
        _live_context(request, machine, timezone.now()),
    )


def _retired_refused(request: HttpRequest, machine: Machine) -> HttpResponse | None:
    """A redirect with an error for a change to a retired machine (kept only in
    the records), else None."""
    if machine.retired_at is None:
        return None
    messages.error(request, f"{machine.name} is retired: it can no longer change.")
    return redirect("hosts:machine", machine_id=machine.id)


@login_required
@require_POST
def machine_pause(request: HttpRequest, machine_id) -> HttpResponse:
    """Pause or resume a machine (POST ``paused`` = 1 or 0)."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    form = PauseForm(request.POST)
    if form.is_valid():
        paused = form.cleaned_data["paused"]
        web_services.machine_pause_set(machine=machine, paused=paused)
        messages.success(
            request, f"{machine.name} {'paused' if paused else 'resumed'}."
        )
    if request.POST.get("next") == "dashboard":
        return redirect("hosts:dashboard")
    return redirect("hosts:machine", machine_id=machine.id)


@login_required
@require_POST
def machine_settings(request: HttpRequest, machine_id) -> HttpResponse:
    """Save the machine's region and serverless choice."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    form = MachineSettingsForm(request.POST)
    if form.is_valid():
        web_services.machine_settings_update(
            machine=machine,
            region=form.cleaned_data["region"],
            accepts_serverless=form.cleaned_data["accepts_serverless"],
        )
        messages.success(request, "Settings saved.")
    else:
        messages.error(request, f"Settings not saved: {_errors(form)}")
    return redirect("hosts:machine", machine_id=machine.id)


def _errors(form) -> str:
    return "; ".join(e for errs in form.errors.values() for e in errs)


@login_required
@require_POST
def machine_rename(request: HttpRequest, machine_id) -> HttpResponse:
    """Rename the machine (POST ``name``): unique among the owner's machines."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    form = MachineRenameForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not renamed: {_errors(form)}")
        return redirect("hosts:machine", machine_id=machine.id)
    old = machine.name
    try:
        web_services.machine_rename(machine=machine, name=form.cleaned_data["name"])
    except services.MachineNameTaken:
        messages.error(request, f"Not renamed: {NAME_TAKEN}")
    else:
        messages.success(request, f"{old} is now {machine.name}.")
    return redirect("hosts:machine", machine_id=machine.id)


@login_required
@require_POST
def machine_retire(request: HttpRequest, machine_id) -> HttpResponse:
    """Retire the machine (POST ``confirm`` = 1): kept in the records, its token
    stops and its devices are never offered work again."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    form = ConfirmForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not retired: tick the box to confirm.")
        return redirect("hosts:machine", machine_id=machine.id)
    try:
        web_services.machine_retire(machine=machine)
    except web_services.MachineRetireRefused as exc:
        messages.error(request, f"Not retired: {exc}.")
        return redirect("hosts:machine", machine_id=machine.id)
    messages.success(
        request,
        f"{machine.name} retired: its token no longer connects; its jobs and"
        " earnings stay in your records.",
    )
    return redirect("hosts:dashboard")


@login_required
@require_POST
def machine_key_reset(request: HttpRequest, machine_id) -> HttpResponse:
    """Forget the pinned key: the agent's next ``hello`` pins its new one."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    if web_services.machine_key_reset(machine=machine):
        messages.success(
            request,
            "Pinned key cleared: the next agent that connects with this token pins its key.",
        )
    else:
        messages.info(request, "No key was pinned.")
    return redirect("hosts:machine", machine_id=machine.id)


@login_required
@require_POST
def machine_token_rotate(request: HttpRequest, machine_id) -> HttpResponse:
    """Give the machine a new token (shown once on its page); the old one stops
    at once and its connection closes. Needs the ``confirm`` box ticked."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    if request.POST.get("confirm") != "1":
        messages.error(request, "Tick the box to confirm: the agent must restart.")
        return redirect("hosts:machine", machine_id=machine.id)
    token = web_services.machine_token_rotate(machine=machine)
    request.session[NEW_TOKEN_SESSION_KEY] = {
        "machine": str(machine.id),
        "token": token,
    }
    messages.success(request, "New token made: the old one no longer connects.")
    return redirect("hosts:machine", machine_id=machine.id)


@login_required
@require_POST
def machine_token_revoke(request: HttpRequest, machine_id) -> HttpResponse:
    """Revoke the machine's token (no agent connects until a rotation gives a
    new one); its connection closes. Needs the ``confirm`` box ticked."""
    machine = selectors.machine_of_owner(user=request.user, machine_id=machine_id)
    if refused := _retired_refused(request, machine):
        return refused
    if request.POST.get("confirm") != "1":
        messages.error(request, "Tick the box to confirm the revocation.")
        return redirect("hosts:machine", machine_id=machine.id)
    web_services.machine_token_revoke(machine=machine)
    messages.success(request, "Token revoked: the machine is disconnected.")
    return redirect("hosts:machine", machine_id=machine.id)
