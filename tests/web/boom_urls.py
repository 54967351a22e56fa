"""Ballast's routes plus one view that fails, for the 500 page's test."""

from django.urls import path

from ballast.urls import urlpatterns as ballast_urlpatterns


def boom(request):
    raise RuntimeError("a bug in a view")


urlpatterns = [path("boom/", boom), *ballast_urlpatterns]
