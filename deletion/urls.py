from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, re_path, register_converter

from deletion.web.api import api, api_not_found
from deletion.web.views import audit, auth, dashboard, registry, requests, review


class ReferenceConverter:
    """Request references and certificate ids: anything else is a 404 before any query."""

    regex = "[A-Za-z0-9._-]{1,64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ReferenceConverter, "ref")

urlpatterns = [
    path("login/", auth.SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", dashboard.healthz, name="healthz"),
    path("", dashboard.dashboard, name="dashboard"),
    path("requests/", requests.request_list, name="request_list"),
    path("requests/new/", requests.request_new, name="request_new"),
    path("requests/<ref:reference>/", requests.request_detail, name="request_detail"),
    path("requests/<ref:reference>/progress.json", requests.request_progress, name="request_progress"),
    path("requests/<ref:reference>/cancel/", requests.request_cancel, name="request_cancel"),
    path("review/", review.review_queue, name="review_queue"),
    path("review/<ref:reference>/approve/", review.review_approve, name="review_approve"),
    path("review/<ref:reference>/deny/", review.review_deny, name="review_deny"),
    path("review/<ref:reference>/extend/", review.review_extend, name="review_extend"),
    path("audit/", audit.audit_trail, name="audit_trail"),
    path("audit/export.<str:fmt>", audit.audit_export, name="audit_export"),
    path("certificates/", registry.certificate_list, name="certificate_list"),
    path("certificates/<ref:certificate_id>.json", registry.certificate_download, name="certificate_download"),
    path("models/", registry.model_list, name="model_list"),
    path("models/<str:name>/", registry.model_detail, name="model_detail"),
    path("models/<str:name>/schedule/", registry.model_schedule, name="model_schedule"),
    path("models/<str:name>/recipients/", registry.recipient_add, name="recipient_add"),
    path("api/v1/", api.urls),
    re_path(r"^api/", api_not_found),
]
