"""foundation: tenancy, secrets, tools, deny rules, calls

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 04:54:01.071404
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('orgs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('slug', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_orgs')),
    sa.UniqueConstraint('slug', name=op.f('uq_orgs_slug'))
    )
    op.create_table('users',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('email', name=op.f('uq_users_email'))
    )
    op.create_table('calls',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('member_id', sa.String(length=40), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('surface', sa.String(length=16), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('target', sa.Text(), nullable=False),
    sa.Column('upstream_url', sa.Text(), nullable=True),
    sa.Column('tool_id', sa.String(length=40), nullable=True),
    sa.Column('tool_name', sa.String(length=200), nullable=True),
    sa.Column('provider', sa.String(length=300), nullable=True),
    sa.Column('endpoint_id', sa.String(length=200), nullable=True),
    sa.Column('status', sa.Integer(), nullable=True),
    sa.Column('outcome', sa.String(length=32), nullable=False),
    sa.Column('refused_by', sa.String(length=32), nullable=True),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('blame', sa.String(length=16), nullable=True),
    sa.Column('credential_tier', sa.String(length=16), nullable=True),
    sa.Column('cost_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('hold_state', sa.String(length=16), nullable=True),
    sa.Column('tag', sa.String(length=200), nullable=True),
    sa.Column('request_bytes', sa.BigInteger(), nullable=True),
    sa.Column('response_bytes', sa.BigInteger(), nullable=True),
    sa.Column('duration_ms', sa.Integer(), nullable=True),
    sa.Column('ttfb_ms', sa.Integer(), nullable=True),
    sa.Column('error_request', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error_response', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_calls_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_calls'))
    )
    op.create_index('ix_calls_org_id_created_at', 'calls', ['org_id', 'created_at'], unique=False)
    op.create_index('ix_calls_org_id_member_id_created_at', 'calls', ['org_id', 'member_id', 'created_at'], unique=False)
    op.create_table('members',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('user_id', sa.String(length=40), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('project_ids', postgresql.ARRAY(sa.String(length=40)), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_members_org_id_orgs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_members_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_members')),
    sa.UniqueConstraint('org_id', 'user_id', name=op.f('uq_members_org_id_user_id'))
    )
    op.create_table('projects',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_projects_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_projects')),
    sa.UniqueConstraint('org_id', 'name', name=op.f('uq_projects_org_id_name'))
    )
    op.create_table('secrets',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=True),
    sa.Column('blob', sa.LargeBinary(), nullable=False),
    sa.Column('key_id', sa.String(length=16), nullable=False),
    sa.Column('is_json', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_secrets_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_secrets'))
    )
    op.create_index(op.f('ix_secrets_provider'), 'secrets', ['provider'], unique=False)
    op.create_table('deny_rules',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('host', sa.String(length=300), nullable=False),
    sa.Column('path', sa.Text(), nullable=True),
    sa.Column('method', sa.String(length=16), nullable=True),
    sa.Column('member_id', sa.String(length=40), nullable=True),
    sa.Column('project_id', sa.String(length=40), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['member_id'], ['members.id'], name=op.f('fk_deny_rules_member_id_members'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_deny_rules_org_id_orgs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_deny_rules_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deny_rules'))
    )
    op.create_index(op.f('ix_deny_rules_org_id'), 'deny_rules', ['org_id'], unique=False)
    op.create_table('tokens',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('member_id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['member_id'], ['members.id'], name=op.f('fk_tokens_member_id_members'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_tokens_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_tokens_token_hash'))
    )
    op.create_table('tools',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('base_url', sa.Text(), nullable=False),
    sa.Column('host', sa.String(length=300), nullable=False),
    sa.Column('bindings', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('project_id', sa.String(length=40), nullable=True),
    sa.Column('allowed_member_ids', postgresql.ARRAY(sa.String(length=40)), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_tools_org_id_orgs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_tools_project_id_projects'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tools')),
    sa.UniqueConstraint('org_id', 'name', name=op.f('uq_tools_org_id_name'))
    )
    op.create_index('ix_tools_org_id_host', 'tools', ['org_id', 'host'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_tools_org_id_host', table_name='tools')
    op.drop_table('tools')
    op.drop_table('tokens')
    op.drop_index(op.f('ix_deny_rules_org_id'), table_name='deny_rules')
    op.drop_table('deny_rules')
    op.drop_index(op.f('ix_secrets_provider'), table_name='secrets')
    op.drop_table('secrets')
    op.drop_table('projects')
    op.drop_table('members')
    op.drop_index('ix_calls_org_id_member_id_created_at', table_name='calls')
    op.drop_index('ix_calls_org_id_created_at', table_name='calls')
    op.drop_table('calls')
    op.drop_table('users')
    op.drop_table('orgs')
