"""Built-in catalog provider: the GitHub REST API.

Shows a header binding (``Authorization: Bearer {secret}``: a personal access token or an app token),
a constant required header (the REST API version pin, sent on every tier), ``strict_query`` reads,
a ``body_allowlist`` write, and a write kept off treg's shared key (``platform_blocked``: an issue
opened on the platform key would be authored by the deployment's account, not the team's).

Prices are the platform tier's examples (GitHub itself does not charge for API calls).
"""

from __future__ import annotations

from treg import hookimpl

_REPO = [
    {"name": "owner", "in": "path", "description": "account owning the repository (case-insensitive)"},
    {"name": "repo", "in": "path", "description": "repository name without .git"},
]
_PAGING = [
    {"name": "per_page", "in": "query", "type": "integer", "description": "results per page, at most 100"},
    {"name": "page", "in": "query", "type": "integer"},
]
_DIRECTION = {"name": "direction", "in": "query", "enum": ["asc", "desc"]}

GITHUB = {
    "id": "github",
    "name": "GitHub REST API",
    "description": "Repositories, users, issues and search on github.com.",
    "docs_url": "https://docs.github.com/en/rest",
    "base_url": "https://api.github.com",
    "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
    "required_headers": {"X-GitHub-Api-Version": "2022-11-28"},
    # an authenticated token's primary limit: 5,000 requests an hour
    "rate_limit": {"limit": 5000, "window_s": 3600},
    "endpoints": [
        {
            "id": "github.repos.get",
            "method": "GET",
            "path": "/repos/{owner}/{repo}",
            "description": "A repository: description, default branch, stars, forks, visibility, license.",
            "docs_url": "https://docs.github.com/en/rest/repos/repos#get-a-repository",
            "params": list(_REPO),
            "price": {"per_call_micro": 100},
            "capability": "code.repository",
            "strict_query": True,
        },
        {
            "id": "github.repos.list-for-user",
            "method": "GET",
            "path": "/users/{username}/repos",
            "description": "Public repositories of a user.",
            "docs_url": "https://docs.github.com/en/rest/repos/repos#list-repositories-for-a-user",
            "params": [
                {"name": "username", "in": "path"},
                {"name": "type", "in": "query", "enum": ["all", "owner", "member"]},
                {"name": "sort", "in": "query", "enum": ["created", "updated", "pushed", "full_name"]},
                _DIRECTION,
            ] + _PAGING,
            "price": {"per_call_micro": 100},
            "capability": "code.repository.list",
            "strict_query": True,
        },
        {
            "id": "github.users.get",
            "method": "GET",
            "path": "/users/{username}",
            "description": "A user's public profile.",
            "docs_url": "https://docs.github.com/en/rest/users/users#get-a-user",
            "params": [{"name": "username", "in": "path"}],
            "price": {"per_call_micro": 100},
            "capability": "code.user",
            "strict_query": True,
        },
        {
            "id": "github.issues.list-for-repo",
            "method": "GET",
            "path": "/repos/{owner}/{repo}/issues",
            "description": "Issues and pull requests of a repository.",
            "docs_url": "https://docs.github.com/en/rest/issues/issues#list-repository-issues",
            "params": _REPO + [
                {"name": "milestone", "in": "query", "description": "a milestone number, * or none"},
                {"name": "state", "in": "query", "enum": ["open", "closed", "all"]},
                {"name": "assignee", "in": "query"},
                {"name": "type", "in": "query"},
                {"name": "creator", "in": "query"},
                {"name": "mentioned", "in": "query"},
                {"name": "labels", "in": "query", "description": "comma-separated label names"},
                {"name": "sort", "in": "query", "enum": ["created", "updated", "comments"]},
                _DIRECTION,
                {"name": "since", "in": "query", "description": "ISO 8601 timestamp"},
            ] + _PAGING,
            "price": {"per_call_micro": 100},
            "capability": "code.issues.list",
            "strict_query": True,
        },
        {
            "id": "github.issues.create",
            "method": "POST",
            "path": "/repos/{owner}/{repo}/issues",
            "description": "Open an issue (needs a token with issues: write on the repository).",
            "docs_url": "https://docs.github.com/en/rest/issues/issues#create-an-issue",
            "params": _REPO + [
                {"name": "title", "in": "body", "required": True, "description": "a string or an integer"},
                {"name": "body", "in": "body", "type": "string"},
                {"name": "assignee", "in": "body", "type": "string"},
                {"name": "milestone", "in": "body", "description": "a milestone number or title"},
                {"name": "labels", "in": "body", "type": "array"},
                {"name": "assignees", "in": "body", "type": "array"},
                {"name": "type", "in": "body", "type": "string"},
            ],
            "price": {"per_call_micro": 200},
            "capability": "code.issues.create",
            "body_allowlist": True,
            "platform_blocked": True,
        },
        {
            "id": "github.search.repositories",
            "method": "GET",
            "path": "/search/repositories",
            "description": "Search repositories (GitHub search qualifiers in q).",
            "docs_url": "https://docs.github.com/en/rest/search/search#search-repositories",
            "params": [
                {"name": "q", "in": "query", "required": True},
                {"name": "sort", "in": "query", "enum": ["stars", "forks", "help-wanted-issues", "updated"]},
                {"name": "order", "in": "query", "enum": ["desc", "asc"]},
            ] + _PAGING,
            "price": {"per_call_micro": 100},
            "capability": "code.search",
            "strict_query": True,
        },
        {
            "id": "github.rate-limit.get",
            "method": "GET",
            "path": "/rate_limit",
            "description": "The token's remaining request allowances (does not count against them).",
            "docs_url": "https://docs.github.com/en/rest/rate-limit/rate-limit",
            "params": [],
            "price": {"per_call_micro": 0},
            "strict_query": True,
        },
    ],
}


@hookimpl
def treg_register_providers():
    return [GITHUB]
