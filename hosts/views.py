"""Server-rendered pages for hosts."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: what Ballast is and where the API lives."""
    return render(request, "hosts/home.html")
