"""Admitting a renter's request: the request's one transaction (DESIGN.md "How a
request flows", steps 1–2).

The key is live and its renter active, the model is in the catalog, the prompt
fits, the credit covers the worst case, the job is stored and, when a device is
free, its first attempt claimed: all in one transaction, before any offer leaves
(CONVENTIONS.md: no renter text reaches a host before its request is admitted).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ballast.ratelimits import limit_full, limit_hit, rate_window_s
from billing.money import nano_to_usd_str
from catalog.modeldata import model_tokenizer
from catalog.models import CatalogModel

from ..errors import ApiError, rate_limited
from ..models import ApiKey, Job, Rental
from ..requests import CompletionRequest, request_for_model
from ..tokens import prompt_token_count, prompt_tokens_least, prompt_tokens_most
from .caps import key_spend_cap_check
from .credit import credit_available_nano, credit_lock, jobs_open_of
from .dispatch import Dispatch, job_dispatch
from .keys import api_key_mark_used, api_key_with_model

# a job's lease, s: the coroutine that runs it renews it; past it the reaper
# closes the job (``endings.attempts_reap``)
JOB_LEASE_S = 30.0


def unauthorized() -> ApiError:
    """The 401 of a missing, unknown or revoked key (or an inactive renter)."""
    return ApiError(401, "missing, invalid or revoked API key", "invalid_api_key")


@transaction.atomic
def job_open(
    *, api_key: str, request: CompletionRequest, waiting_channel: str
) -> tuple[Job, CatalogModel, Dispatch]:
    """Admit a renter's checked request and make its first dispatch, in one
    transaction; return (job, its catalog model, the dispatch: an attempt with its
    offer, a wait or an impossibility, as ``dispatch.job_dispatch``).

    ``api_key``: the plain key the request carried (checked here, on every
    request, whatever the transport); ``waiting_channel``: the channel of the
    coroutine that will run the job. Raises ApiError 401 (key), 404 (model or
    rental), 409 (rental not live), 400 (the prompt and ``max_tokens`` past the
    context), 402 (credit, or the key's spending cap:
    ``caps.key_spend_cap_check``) or 429 (``key_rate_check``, ``key_jobs_check``,
    ``queue_share_check``: DESIGN.md "Limits and abuse"); then nothing is stored
    and no slot is held.
    """
    # it stores no money: it commits unflushed (``ballast.db.commit_unflushed_sql``);
    # the model is read with the key, judged after the key's limits
    key, model = api_key_with_model(
        plain=api_key, model_id=request.model, unflushed=True
    )
    if key is None:
        raise unauthorized()
    key_rate_check(key=key)
    key_empty_answers_check(key=key)
    api_key_mark_used(key=key)
    model = request_model(request, model)
    job = job_submit(
        api_key=key, request=request, model=model, waiting_channel=waiting_channel
    )
    dispatch = job_dispatch(job=job, model=model, waiting_channel=waiting_channel)
    if dispatch.wait:
        queue_share_check(job=job)
    return job, model, dispatch


def key_rate_check(*, key: ApiKey) -> None:
    """ApiError 429 when the key is past ``BALLAST_KEY_RATE`` requests (a rate
    such as ``120/minute``, counted through ``ballast.ratelimits``: in Redis,
    shared by every coordinator process)."""
    wait = limit_hit(settings.BALLAST_KEY_RATE, "key", key.id)
    if wait is not None:
        raise rate_limited(
            f"this API key is past {settings.BALLAST_KEY_RATE} requests", wait
        )


def key_empty_answers_check(*, key: ApiKey) -> None:
    """ApiError 429 when ``BALLAST_EMPTY_ANSWER_RATE`` answers of the key came
    back empty within its window (``key_empty_answer_record``): a renter whose
    prompts keep making the model end at once is limited, never the hosts
    (DESIGN.md "Fair to honest hosts"). A key whose last empty answer
    (``last_empty_answer_at``) is older than the window has none in it: its
    counter is not asked (one round trip to Redis less per request)."""
    rate = settings.BALLAST_EMPTY_ANSWER_RATE
    last = key.last_empty_answer_at
    if last is None or last <= timezone.now() - timedelta(seconds=rate_window_s(rate)):
        return
    wait = limit_full(rate, "key.empty", key.id)
    if wait is not None:
        raise rate_limited(
            "this API key's requests ended with an empty answer "
            f"{settings.BALLAST_EMPTY_ANSWER_RATE} (the model ended at once)",
            wait,
        )


def key_empty_answer_record(*, key_id) -> None:
    """Count one empty answer of key ``key_id`` (``key_empty_answers_check``),
    then note the time on the key (``ApiKey.last_empty_answer_at``): taken
    after the count's, and never earlier than the one noted already (two ends
    may commit out of order), so the counter is asked as long as it holds it."""
    limit_hit(settings.BALLAST_EMPTY_ANSWER_RATE, "key.empty", key_id)
    now = Value(timezone.now())
    ApiKey.objects.filter(id=key_id).update(
        last_empty_answer_at=Greatest(Coalesce("last_empty_answer_at", now), now)
    )


def key_jobs_check(*, key: ApiKey, open_jobs: list[Job]) -> None:
    """ApiError 429 when the key already has ``BALLAST_KEY_MAX_JOBS`` open jobs.

    Counted from the renter's open jobs (``open_jobs``: ``credit.jobs_open_of``)
    read under the renter's credit lock (the caller holds it), so parallel
    requests on any process cannot pass it together, and a job that ends (or is
    reaped) frees its place: no counter to leak.
    """
    mine = sum(1 for job in open_jobs if job.api_key_id == key.id)
    if mine >= settings.BALLAST_KEY_MAX_JOBS:
        raise rate_limited(
            f"this API key has {mine} jobs running or queued (at most "
            f"{settings.BALLAST_KEY_MAX_JOBS} at once)",
            1,
        )


def queue_share_check(*, job: Job) -> None:
    """ApiError 429 when ``job`` (about to wait for a slot) would give its renter
    more than ``BALLAST_QUEUE_SHARE`` of its model's queue, once the renter has
    ``BALLAST_QUEUE_SHARE_MIN`` jobs waiting there: one renter cannot fill a
    model's first-come-first-served queue and push every other renter into
    504s. Waiting jobs: serverless, queued, with a live lease (as
    ``dispatch.jobs_ahead_count``). Called under the renter's credit lock."""
    waiting = Job.objects.filter(
        model_id=job.model_id,
        status=Job.Status.QUEUED,
        target_device__isnull=True,
        lease_until__gt=timezone.now(),
    ).exclude(id=job.id)
    mine = waiting.filter(renter_id=job.renter_id).count()
    if mine < settings.BALLAST_QUEUE_SHARE_MIN:
        return
    if mine + 1 > settings.BALLAST_QUEUE_SHARE * (waiting.count() + 1):
        raise rate_limited(
            f"you have {mine} requests waiting for {job.model_id}, past your "
            f"share ({settings.BALLAST_QUEUE_SHARE}) of its queue",
            1,
        )


def job_submit(
    *,
    api_key: ApiKey,
    request: CompletionRequest,
    model: CatalogModel,
    waiting_channel: str = "",
) -> Job:
    """A renter's checked request for the active catalog model ``model`` as a
    new job (``job_build``: unsaved, stored with its first claim by
    ``dispatch.job_dispatch``) inside the caller's transaction.

    The renter's credit account is locked until the transaction ends, so
    parallel requests cannot overspend the credit nor the key's spending cap.
    Raises ApiError as ``job_open``.
    """
    tokenizer = model_tokenizer(model.id)  # tools in the model's own format
    request = request_for_model(
        request,
        tool_call_format=model.tool_call_format,
        template=tokenizer.template if tokenizer is not None else None,
    )
    rental = _request_rental(request, renter=api_key.user)
    request_fits(model, request)
    worst_case = request.params["max_tokens"] * model.price_completion_nano
    account = credit_lock(renter=api_key.user)
    open_jobs = jobs_open_of(renter=api_key.user)
    key_jobs_check(key=api_key, open_jobs=open_jobs)
    available = credit_available_nano(
        renter=api_key.user, account=account, open_jobs=open_jobs
    )
    if available < worst_case:
        raise _credit_refused(available, request, model)
    key_spend_cap_check(
        key=api_key,
        open_jobs=open_jobs,
        worst_case_nano=worst_case,
        max_tokens=request.params["max_tokens"],
    )
    return job_build(
        renter=api_key.user,
        api_key=api_key,
        rental=rental,
        model=model,
        endpoint=request.endpoint,
        messages=request.messages,
        prompt=request.prompt,
        params=request.params,
        placement=request.placement,
        stream=request.stream,
        waiting_channel=waiting_channel,
    )


def job_create(**fields) -> Job:
    """Store a new queued job (``job_build``'s, with the same ``fields``): for
    the jobs made outside a request (spot checks); a request's job is stored
    with its first claim (``dispatch.job_dispatch``)."""
    job = job_build(**fields)
    job.save(force_insert=True)
    return job


def job_build(
    *,
    renter: AbstractBaseUser | None,
    api_key: ApiKey | None,
    model: CatalogModel,
    endpoint: str,
    messages: list[dict] | None,
    prompt: str | None,
    params: dict,
    placement: dict,
    stream: bool,
    is_spot_check: bool = False,
    rental: Rental | None = None,
    target_device_id: int | None = None,
    waiting_channel: str = "",
) -> Job:
    """A new queued job, unsaved, its lease held (``JOB_LEASE_S``) by the
    coroutine that will run it, at the model's price now.

    A rental's job runs only on the rented device, a spot check on its
    ``target_device_id``; ``waiting_channel`` is woken when a slot frees.
    """
    if rental is not None:
        target_device_id = rental.device_id
    return Job(
        rental=rental,
        target_device_id=target_device_id,
        waiting_channel=waiting_channel,
        renter=renter,
        api_key=api_key,
        model_id=model.id,
        price_completion_nano=model.price_completion_nano,
        endpoint=endpoint,
        messages=messages,
        prompt=prompt,
        params=params,
        placement=placement,
        stream=stream,
        is_spot_check=is_spot_check,
        lease_until=timezone.now() + timedelta(seconds=JOB_LEASE_S),
    )


def job_lease_renew(*, job_id: str) -> bool:
    """Extend the lease of an open job (its coroutine is alive) to
    ``JOB_LEASE_S`` from now. Returns False when the job is no longer open (the
    lease was lost: ``attempts_reap`` closed it), True when renewed."""
    return bool(
        Job.objects.filter(id=job_id, status__in=Job.OPEN_STATUSES).update(
            lease_until=timezone.now() + timedelta(seconds=JOB_LEASE_S)
        )
    )


def request_model(
    request: CompletionRequest, model: CatalogModel | None
) -> CatalogModel:
    """The active catalog model the request names, as read (``model``: None
    when there is none, ``keys.api_key_with_model``); ApiError 404 when none."""
    if model is None:
        raise ApiError(
            404,
            f"model '{request.model}' is not in the catalog",
            "model_not_found",
            "model",
        )
    return model


def _request_rental(request: CompletionRequest, *, renter) -> Rental | None:
    """The renter's live rental named by ``placement.rental``, or None when none
    is named; ApiError 404 (not the renter's, or no such rental), 409 (not live)."""
    named = request.placement.get("rental")
    if not named:
        return None
    try:
        rental_id = uuid.UUID(str(named))
    except ValueError:
        rental_id = None
    rental = Rental.objects.filter(id=rental_id, renter=renter).first()
    if rental is None:
        raise ApiError(
            404, f"rental '{named}' not found", "rental_not_found", "placement.rental"
        )
    if rental.status != Rental.Status.LIVE:
        raise ApiError(
            409,
            f"rental '{rental.id}' is {rental.status}, not live",
            "rental_not_live",
            "placement.rental",
        )
    return rental


def request_fits(model: CatalogModel, request: CompletionRequest) -> None:
    """ApiError 400 when the prompt (counted as the host's engine counts it:
    ``tokens.prompt_token_count``) plus ``max_tokens`` exceed the model's context.

    A prompt whose bytes alone bound it within the context
    (``tokens.prompt_tokens_most``) is not tokenized; one whose lower bound is
    already past it (``tokens.prompt_tokens_least``: megabytes of prompt) is
    refused without tokenizing. A ``max_tokens`` that leaves no room for any
    prompt is refused first, quoting the bound of this model's context.
    """
    if request.params["max_tokens"] >= model.context_length:
        raise ApiError(
            400,
            f"'max_tokens' must be an integer from 1 to {model.context_length - 1}"
            f" for {model.id}: its context is {model.context_length} tokens,"
            " the prompt included",
            "context_length_exceeded",
            "max_tokens",
        )
    room = model.context_length - request.params["max_tokens"]
    most = prompt_tokens_most(model.id, request.messages, request.prompt)
    if most is not None and most <= room:
        return
    field = "messages" if request.messages is not None else "prompt"
    least = prompt_tokens_least(model.id, request.messages, request.prompt)
    if least is not None and least > room:
        count, unit = (
            (len(request.messages), "message")
            if request.messages is not None
            else (len(request.prompt or ""), "character")
        )
        what = f"{count} {unit}{'' if count == 1 else 's'}"
        raise ApiError(
            400,
            f"the prompt (at least {least} tokens: {what}) plus "
            f"max_tokens={request.params['max_tokens']} exceed the "
            f"model's context of {model.context_length} tokens",
            "context_length_exceeded",
            field,
        )
    prompt_tokens = prompt_token_count(model.id, request.messages, request.prompt)
    if prompt_tokens is not None and prompt_tokens > room:
        raise ApiError(
            400,
            f"the prompt ({prompt_tokens} tokens) plus max_tokens="
            f"{request.params['max_tokens']} exceed the model's context of "
            f"{model.context_length} tokens",
            "context_length_exceeded",
            field,
        )


def _credit_refused(
    available: int, request: CompletionRequest, model: CatalogModel
) -> ApiError:
    """The 402 of a request whose worst case ``available`` nano-USD (the balance
    less reservations) cannot cover."""
    return ApiError(
        402,
        f"available credit {nano_to_usd_str(available)} USD (the balance less the "
        "worst case of your open jobs) cannot cover max_tokens="
        f"{request.params['max_tokens']} at "
        f"{nano_to_usd_str(model.price_completion_nano)} USD per token",
        "insufficient_credit",
    )
