"""Sign-in: Django's view, answering 400 (not 200) when the credentials are refused."""
from __future__ import annotations

from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpResponse


class SignInView(LoginView):
    template_name = "web/login.html"
    redirect_authenticated_user = True

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        response.status_code = 400
        return response
