"""Account routes under /accounts/: sign up, and django.contrib.auth's log in/out and
password reset views (templates in templates/registration/)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from . import views
from .forms import EmailAuthenticationForm

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path(
        "login/",
        auth_views.LoginView.as_view(authentication_form=EmailAuthenticationForm),
        name="login",
    ),
    path("", include("django.contrib.auth.urls")),
]
