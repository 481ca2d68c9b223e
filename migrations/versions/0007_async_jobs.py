"""async jobs: the async_jobs table (owned vendor jobs and their open holds) and calls.kind

Revision ID: 0007
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('kind', sa.String(length=16), nullable=True))
    op.create_table('async_jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('member_id', sa.String(length=40), nullable=True),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('endpoint_id', sa.String(length=200), nullable=False),
    sa.Column('task_id', sa.String(length=500), nullable=False),
    sa.Column('call_id', sa.String(length=200), nullable=False),
    sa.Column('poll_endpoint', sa.String(length=200), nullable=False),
    sa.Column('fetch_endpoint', sa.String(length=200), nullable=True),
    sa.Column('state', sa.String(length=16), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('fetch_ids', postgresql.ARRAY(sa.String(length=500)), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_polled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'done', 'failed', 'expired')", name=op.f('ck_async_jobs_state')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_async_jobs_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_async_jobs')),
    sa.UniqueConstraint('call_id', name=op.f('uq_async_jobs_call_id')),
    sa.UniqueConstraint('provider', 'task_id', name=op.f('uq_async_jobs_provider_task_id'))
    )
    op.create_index('ix_async_jobs_fetch_ids', 'async_jobs', ['fetch_ids'], unique=False, postgresql_using='gin')
    op.create_index('ix_async_jobs_org_id_created_at', 'async_jobs', ['org_id', 'created_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_async_jobs_org_id_created_at', table_name='async_jobs')
    op.drop_index('ix_async_jobs_fetch_ids', table_name='async_jobs', postgresql_using='gin')
    op.drop_table('async_jobs')
    op.drop_column('calls', 'kind')
