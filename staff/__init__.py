"""The staff console (issue 35): pages that answer what staff get asked.

- the fleet per model: devices online, slots free, the queue, failures and
  checks over the last hour (``/staff/``);
- a renter's whole picture: balance, keys with their caps, jobs with their
  attempts, credit history, tickets, rentals (``/staff/renters/<id>/``);
- a machine's and a device's whole picture: outcomes with their job and the
  reason in words, spot checks, verifications, holds, earnings, uptime, and
  quarantine or release with a reason the host reads (``/staff/machines/…``,
  ``/staff/devices/…``).

Above every other app (it reads them all, writes only through their
services); staff only (``is_staff``), everyone else is sent to log in.
"""
