"""Account routes under /accounts/: sign up, and django.contrib.auth's log in/out and
password reset views (templates in templates/registration/). Sign-ups, logins and
password resets are rate limited per address and account (``ballast.ratelimits``)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from ballast.ratelimits import post_limited

from . import views
from .forms import EmailAuthenticationForm

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path(
        "login/",
        post_limited("BALLAST_LOGIN_RATE", "login", field="username")(
            auth_views.LoginView.as_view(
                authentication_form=EmailAuthenticationForm, next_page="landing"
            )
        ),
        name="login",
    ),
    path("landing/", views.landing, name="landing"),
    path(
        "password_reset/",
        post_limited("BALLAST_PASSWORD_RESET_RATE", "password_reset", field="email")(
            auth_views.PasswordResetView.as_view()
        ),
        name="password_reset",
    ),
    path("", include("django.contrib.auth.urls")),
]
