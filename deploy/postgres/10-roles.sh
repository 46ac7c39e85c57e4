#!/bin/sh
# Run once by the postgres image on an empty data folder (docker-entrypoint-initdb.d).
# Two roles instead of one superuser for everything (docs/security.md):
#   erasure_owner  owns the database and its tables; only the `migrate` service logs in as it
#   erasure_app    web and workers; rows only (python -m deletion.domain.roles grant-app)
# Neither is a superuser, may create roles or databases, or bypasses row security.
# The passwords are secret files (docker-compose.yml); the application reads the same
# files through DATABASE_PASSWORD_FILE.
set -eu
owner_password=$(cat "${POSTGRES_OWNER_PASSWORD_FILE:?}")
app_password=$(cat "${POSTGRES_APP_PASSWORD_FILE:?}")
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
     -v owner_password="$owner_password" -v app_password="$app_password" <<'SQL'
CREATE ROLE erasure_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS
    PASSWORD :'owner_password';
CREATE ROLE erasure_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS
    PASSWORD :'app_password';
CREATE DATABASE erasure OWNER erasure_owner;
REVOKE ALL ON DATABASE erasure FROM PUBLIC;
GRANT CONNECT ON DATABASE erasure TO erasure_app;
SQL
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname erasure <<'SQL'
ALTER SCHEMA public OWNER TO erasure_owner;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SQL
