"""async jobs: terms frozen at submission (async_jobs.terms) and async_job_utilities

A job's poll/fetch endpoints, price and task parameter are frozen on its row, and every way a recorded
job may be read is kept in async_job_utilities, so a later catalog cannot make a job's poll or fetch a
free platform row. Existing jobs name their utilities with an unknown parameter ('').

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('async_jobs', sa.Column('terms', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.create_table('async_job_utilities',
    sa.Column('endpoint_id', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('task_param', sa.String(length=100), nullable=False),
    sa.Column('by_result_id', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('poll', 'fetch')", name=op.f('ck_async_job_utilities_kind')),
    sa.PrimaryKeyConstraint('endpoint_id', 'kind', 'task_param', 'by_result_id', name=op.f('pk_async_job_utilities'))
    )
    # the jobs already recorded keep their utilities owner-only (their parameter was not recorded)
    op.execute("INSERT INTO async_job_utilities (endpoint_id, kind, task_param, by_result_id) "
               "SELECT DISTINCT poll_endpoint, 'poll', '', false FROM async_jobs")
    op.execute("INSERT INTO async_job_utilities (endpoint_id, kind, task_param, by_result_id) "
               "SELECT DISTINCT fetch_endpoint, 'fetch', '', false FROM async_jobs WHERE fetch_endpoint IS NOT NULL")


def downgrade() -> None:
    op.drop_table('async_job_utilities')
    op.drop_column('async_jobs', 'terms')
