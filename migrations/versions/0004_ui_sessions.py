"""ui_sessions: the dashboard's server-side sessions; calls indexes for the Activity filters

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ui_sessions',
        # sha256 of the cookie's random session id: a stolen database row cannot be replayed as a cookie
        sa.Column('id_hash', sa.String(length=64), nullable=False),
        sa.Column('org_id', sa.String(length=40), nullable=False),
        sa.Column('member_id', sa.String(length=40), nullable=False),
        sa.Column('token_id', sa.String(length=40), nullable=False),
        sa.Column('csrf', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name='fk_ui_sessions_org_id_orgs', ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['member_id'], ['members.id'], name='fk_ui_sessions_member_id_members',
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['token_id'], ['tokens.id'], name='fk_ui_sessions_token_id_tokens',
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id_hash', name='pk_ui_sessions'),
    )
    op.create_index('ix_ui_sessions_expires_at', 'ui_sessions', ['expires_at'])
    # Activity's filters walk these newest first (keyset on created_at, id): docs/dashboard.md
    op.create_index('ix_calls_org_id_outcome_created_at', 'calls', ['org_id', 'outcome', 'created_at'])
    op.create_index('ix_calls_org_id_tool_name_created_at', 'calls', ['org_id', 'tool_name', 'created_at'])
    # the Overview's failing providers: only upstream failures, so a small index (partial)
    op.create_index('ix_calls_org_id_created_at_upstream_failed', 'calls', ['org_id', 'created_at'],
                    postgresql_where=sa.text("blame = 'upstream'"))


def downgrade() -> None:
    op.drop_index('ix_calls_org_id_created_at_upstream_failed', table_name='calls')
    op.drop_index('ix_calls_org_id_tool_name_created_at', table_name='calls')
    op.drop_index('ix_calls_org_id_outcome_created_at', table_name='calls')
    op.drop_index('ix_ui_sessions_expires_at', table_name='ui_sessions')
    op.drop_table('ui_sessions')
